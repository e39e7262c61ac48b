// A Hugging Face tokenizer.json with a BPE model (tokenizer.h): the added
// tokens matched in the text, then per remaining part the normalizer, the
// added tokens written in normalized form, the pre-tokenizer and the model;
// the post-processor's special tokens around; decoding through the decoders.
#include "strata/recipes/data/tokenizer/bpe.h"
#include "strata/recipes/data/tokenizer/pipeline.h"
#include "strata/recipes/data/tokenizer/tiktoken.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tokenizer::Bpe;
using tokenizer::MatchScratch;
using tokenizer::Piece;

/// tokenizer.json files above this are refused before they are read: the
/// largest real ones (Llama 3, Qwen) are under 12 MB.
constexpr uintmax_t kMaxTokenizerBytes = 256ull << 20;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

/// The added tokens of one kind (raw or normalized), by first byte, longest first.
class AddedMatcher {
 public:
  void add(std::string pattern, const AddedToken* token) {
    if (!pattern.empty()) by_byte_[static_cast<unsigned char>(pattern[0])].emplace_back(std::move(pattern), token);
  }
  void finish() {
    for (auto& list : by_byte_) {
      std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    }
  }
  struct Segment {
    std::string text;
    const AddedToken* token;  ///< null: text to tokenize
    size_t offset;
  };
  /// `text` cut into added tokens (leftmost, then longest) and the text between.
  std::vector<Segment> split(const std::string& text) const;

 private:
  std::vector<std::pair<std::string, const AddedToken*>> by_byte_[256];
};

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (c & 0x80); }

std::vector<AddedMatcher::Segment> AddedMatcher::split(const std::string& text) const {
  std::vector<Segment> out;
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const auto& candidates = by_byte_[static_cast<unsigned char>(text[i])];
    const std::pair<std::string, const AddedToken*>* hit = nullptr;
    for (const auto& c : candidates) {
      if (text.compare(i, c.first.size(), c.first) == 0) {
        hit = &c;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->first.size();
    const AddedToken& t = *hit->second;
    if (t.single_word && ((begin > 0 && word_char(text[begin - 1])) || (end < text.size() && word_char(text[end])))) {
      i = end;
      continue;
    }
    if (t.lstrip) while (begin > last && ascii_space(text[begin - 1])) --begin;
    if (t.rstrip) while (end < text.size() && ascii_space(text[end])) ++end;
    if (begin > last) out.push_back({text.substr(last, begin - last), nullptr, last});
    out.push_back({text.substr(begin, end - begin), &t, begin});
    last = i = end;
  }
  if (last < text.size()) out.push_back({text.substr(last), nullptr, last});
  return out;
}

class HfScratch : public TokenizerScratch {
 public:
  MatchScratch match;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

class HfTokenizer : public Tokenizer {
 public:
  HfTokenizer(const json& j, std::string path);
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens, TokenizerScratch& scratch) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  std::unique_ptr<TokenizerScratch> make_scratch() const override { return std::make_unique<HfScratch>(); }
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  const std::string& path() const override { return path_; }

 private:
  void encode_text(const std::string& text, bool first, HfScratch& scratch, std::vector<int32_t>& out) const;

  std::string path_;
  std::unique_ptr<tokenizer::TokenModel> model_;
  std::vector<AddedToken> added_;
  AddedMatcher raw_, normalized_;
  std::unique_ptr<tokenizer::Normalizer> normalizer_;
  std::unique_ptr<tokenizer::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<tokenizer::Decoder> decoder_;
  tokenizer::SpecialAround around_;
  bool byte_level_ = false;
  std::vector<std::string> id_to_token_;
  std::set<int32_t> special_ids_;
};

/// model.unk_token's id, if it names one.
std::optional<int32_t> unk_of(const json& m, const std::unordered_map<std::string, int32_t>& vocab) {
  if (!m.contains("unk_token") || !m["unk_token"].is_string()) return std::nullopt;
  const auto it = vocab.find(m["unk_token"].get<std::string>());
  TORCH_CHECK_VALUE(it != vocab.end(), "model.unk_token '", m["unk_token"].get<std::string>(), "' is not in the vocabulary");
  return it->second;
}

std::unique_ptr<tokenizer::TokenModel> make_model(const json& m) {
  const std::string type = m.value("type", std::string("BPE"));
  if (type == "WordLevel") {
    auto vocab = tokenizer::read_vocab(m.at("vocab"), "model.vocab");
    const auto unk = unk_of(m, vocab);
    return std::make_unique<tokenizer::WordLevel>(std::move(vocab), unk);
  }
  TORCH_CHECK_VALUE(type == "BPE", "model type '", type, "' is not supported; supported: BPE, WordLevel");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    TORCH_CHECK_VALUE(!m.contains(key) || m[key].is_null() || m[key] == "", "model.", key, " '", m[key].dump(),
                      "' is not supported (a BPE of GPT-2's or SentencePiece's kind has none)");
  }
  auto vocab = tokenizer::read_vocab(m.at("vocab"), "model.vocab");
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& entry : m.at("merges")) {
    if (entry.is_array()) {
      TORCH_CHECK_VALUE(entry.size() == 2, "a merge is not a pair: ", entry.dump());
      merges.emplace_back(entry[0].get<std::string>(), entry[1].get<std::string>());
    } else {
      const std::string s = entry.get<std::string>();
      const size_t space = s.find(' ');
      TORCH_CHECK_VALUE(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
                        "a merge is not \"a b\": '", s, "'");
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    }
  }
  tokenizer::BpeOptions options;
  options.byte_fallback = m.value("byte_fallback", false);
  options.ignore_merges = m.value("ignore_merges", false);
  options.fuse_unk = m.value("fuse_unk", false);
  options.unk_id = unk_of(m, vocab);
  return std::make_unique<Bpe>(std::move(vocab), merges, options);
}

HfTokenizer::HfTokenizer(const json& j, std::string path) : path_(std::move(path)) {
  model_ = make_model(j.at("model"));
  normalizer_ = tokenizer::make_normalizer(j.value("normalizer", json()));
  pre_tokenizer_ = tokenizer::make_pre_tokenizer(j.value("pre_tokenizer", json()));
  decoder_ = tokenizer::make_decoder(j.value("decoder", json()));
  byte_level_ = pre_tokenizer_ && pre_tokenizer_->byte_level();
  int32_t max_id = -1;
  for (const auto& [token, id] : model_->vocab()) max_id = std::max(max_id, id);
  for (const auto& a : j.value("added_tokens", json::array())) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = static_cast<int32_t>(tokenizer::whole_in(a.at("id"), INT32_MAX, "added token id"));
    t.special = a.value("special", false);
    t.single_word = a.value("single_word", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", !t.special);
    TORCH_CHECK_VALUE(t.id >= 0, "added token '", t.content, "' has a negative id ", t.id);
    max_id = std::max(max_id, t.id);
    added_.push_back(std::move(t));
  }
  id_to_token_.resize(size_t(max_id + 1));
  for (const auto& [token, id] : model_->vocab()) id_to_token_[size_t(id)] = token;
  std::map<std::string, int32_t> special_by_name;
  MatchScratch scratch;
  for (const auto& t : added_) {
    id_to_token_[size_t(t.id)] = t.content;
    if (t.special) special_ids_.insert(t.id);
    special_by_name[t.content] = t.id;
    if (t.normalized && normalizer_) normalized_.add(normalizer_->apply(t.content, scratch), &t);
    else (t.normalized ? normalized_ : raw_).add(t.content, &t);
  }
  raw_.finish();
  normalized_.finish();
  around_ = tokenizer::make_post_processor(j.value("post_processor", json()), special_by_name);
}

void HfTokenizer::encode_text(const std::string& text, bool first, HfScratch& scratch, std::vector<int32_t>& out) const {
  std::vector<Piece> pieces{{text, first}};
  if (pre_tokenizer_) pre_tokenizer_->apply(pieces, scratch.match);
  for (const Piece& p : pieces) {
    auto [it, fresh] = scratch.words.try_emplace(p.text);
    if (fresh) {
      if (byte_level_) {
        std::string mapped;
        for (char c : p.text) mapped += tokenizer::byte_to_char()[static_cast<unsigned char>(c)];
        model_->encode(mapped, it->second);
      } else {
        model_->encode(p.text, it->second);
      }
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  // A bounded cache: natural text has few distinct words, but a file of
  // random bytes has many.
  if (scratch.words.size() > (1u << 20)) scratch.words.clear();
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens,
                                         TokenizerScratch& scratch_base) const {
  auto& scratch = dynamic_cast<HfScratch&>(scratch_base);
  size_t bad = 0;
  TORCH_CHECK_VALUE(tokenizer::valid_utf8(text, &bad), "text is not UTF-8: byte ", bad, " (0x", std::hex,
                    int(static_cast<unsigned char>(text[bad])), ") starts no valid character");
  std::vector<int32_t> out;
  if (add_special_tokens) out = around_.before;
  try {
    for (const auto& segment : raw_.split(std::string(text))) {
      if (segment.token != nullptr) {
        out.push_back(segment.token->id);
        continue;
      }
      const bool first = segment.offset == 0;
      const std::string normalized = normalizer_ ? normalizer_->apply(segment.text, scratch.match) : segment.text;
      for (const auto& part : normalized_.split(normalized)) {
        if (part.token != nullptr) out.push_back(part.token->id);
        else encode_text(part.text, first && part.offset == 0, scratch, out);
      }
    }
  } catch (const c10::ValueError& e) {  // a text this tokenizer cannot encode: name the tokenizer
    tokenizer::fail(c10::str("tokenizer '", path_, "': ", e.what_without_backtrace()));
  }
  if (add_special_tokens) out.insert(out.end(), around_.after.begin(), around_.after.end());
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    TORCH_CHECK_VALUE(id >= 0 && id < int32_t(id_to_token_.size()), "token id ", id, " is out of range [0, ",
                      id_to_token_.size(), ") of ", path_);
    if (skip_special_tokens && special_ids_.count(id)) continue;
    tokens.push_back(id_to_token_[size_t(id)]);
  }
  if (decoder_) tokens = decoder_->apply(std::move(tokens));
  else if (!tokens.empty()) {
    // No decoder: the tokens joined by spaces, as tokenizers does.
    std::string joined = tokens[0];
    for (size_t i = 1; i < tokens.size(); ++i) joined += " " + tokens[i];
    tokens = {joined};
  }
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

std::optional<int32_t> HfTokenizer::token_to_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  const auto it = model_->vocab().find(token);
  if (it == model_->vocab().end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const auto scratch = make_scratch();
  return encode(text, add_special_tokens, *scratch);
}

std::optional<std::string> tokenizer_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    if (fs::is_regular_file(fs::path(path) / name, ec)) return (fs::path(path) / name).string();
  }
  return std::nullopt;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  const auto found = tokenizer_file(path);
  TORCH_CHECK_VALUE(found && fs::is_regular_file(*found, ec), "tokenizer '", path, "': ",
                    found ? "no such file" : "the directory has no tokenizer.json or tokenizer.model");
  const std::string file = *found;
  const uintmax_t size = fs::file_size(file, ec);
  TORCH_CHECK_VALUE(!ec && size <= kMaxTokenizerBytes, "tokenizer '", file, "': ", size,
                    " bytes is above the ", kMaxTokenizerBytes >> 20, " MiB a tokenizer file may have");
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "tokenizer '", file, "' cannot be read");
  std::string head(256, '\0');
  head.resize(size_t(in.read(head.data(), std::streamsize(head.size())).gcount()));
  in.clear();
  in.seekg(0);
  json j;
  try {
    if (tokenizer::looks_like_tiktoken(head)) {
      j = tokenizer::tiktoken_as_tokenizer_json(file);
    } else {
      // JSON text holds no NUL byte; a SentencePiece model (protobuf) starts
      // with its first piece's field, 0x0a, and holds several.
      const bool binary = head.find('\0') != std::string::npos;
      TORCH_CHECK_VALUE(!binary || head[0] != '\x0a',
                        "a SentencePiece model, which strata does not read: give the model's tokenizer.json "
                        "(transformers writes one from it: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))");
      TORCH_CHECK_VALUE(!binary, "a binary file, not a tokenizer.json or a tiktoken BPE file");
      j = json::parse(in);
    }
  } catch (const json::exception& e) {
    tokenizer::fail(c10::str("tokenizer '", file, "' is not JSON: ", e.what()));
  } catch (const c10::ValueError& e) {
    tokenizer::fail(c10::str("tokenizer '", file, "': ", e.what_without_backtrace()));
  }
  try {
    TORCH_CHECK_VALUE(j.is_object() && j.contains("model"), "no \"model\" section");
    return std::make_unique<HfTokenizer>(j, file);
  } catch (const json::exception& e) {
    tokenizer::fail(c10::str("tokenizer '", file, "' is not a tokenizer.json: ", e.what()));
  } catch (const c10::ValueError& e) {
    tokenizer::fail(c10::str("tokenizer '", file, "': ", e.what_without_backtrace()));
  }
}

}  // namespace strata::recipes
