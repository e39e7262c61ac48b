// tiktoken.h: a tiktoken BPE file as the tokenizer.json it converts to.
#include "strata/recipes/data/tokenizer/tiktoken.h"

#include "strata/recipes/data/tokenizer/pipeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace strata::recipes::tokenizer {

namespace {

using json = nlohmann::json;

/// Llama 3's split regex (Meta's llama3/tokenizer.py `pat_str`, the same as
/// its tokenizer.json's Split pattern).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr int kLlama3SpecialTokens = 256;

/// Llama 3's special tokens after the ranks, named as Meta's llama3 code names
/// them (Llama 3.1 and later; 3.0 named some of them differently).
std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> names = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                    "<|python_tag|>", "<|image|>"};
  for (int i = 2; names.size() < size_t(kLlama3SpecialTokens); ++i)
    names.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return names;
}

/// The bytes of standard base64 `text`; nullopt where it is not base64.
std::optional<std::string> base64_decode(const std::string& text) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < alphabet.size(); ++i) v[static_cast<unsigned char>(alphabet[i])] = int8_t(i);
    return v;
  }();
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t bits = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      // '=' only at the end of the last group, at most two.
      if (c == '=' && i + 4 == text.size() && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++pad;
        bits <<= 6;
        continue;
      }
      const int8_t v = value[static_cast<unsigned char>(c)];
      if (v < 0 || pad > 0) return std::nullopt;
      bits = (bits << 6) | uint32_t(v);
    }
    for (int k = 0; k < 3 - pad; ++k) out += char((bits >> (16 - 8 * k)) & 0xff);
  }
  return out;
}

/// The ranks of the file: the token's bytes at index rank.
std::vector<std::string> read_ranks(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "cannot be read");
  std::vector<std::string> tokens;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto bytes = space == std::string::npos ? std::nullopt : base64_decode(line.substr(0, space));
    const std::string rank = space == std::string::npos ? "" : line.substr(space + 1);
    TORCH_CHECK_VALUE(bytes && !rank.empty() && rank.size() < 10 &&
                          std::all_of(rank.begin(), rank.end(), [](char c) { return c >= '0' && c <= '9'; }),
                      "line ", number, " is not \"<base64 bytes> <rank>\": '", line.substr(0, 80), "'");
    TORCH_CHECK_VALUE(std::stoul(rank) == tokens.size(), "line ", number, ": rank ", rank, " where ", tokens.size(),
                      " was expected (ranks must run 0, 1, 2, ...)");
    tokens.push_back(*bytes);
  }
  TORCH_CHECK_VALUE(tokens.size() >= 256, "holds ", tokens.size(), " tokens; a byte-level BPE has at least 256");
  return tokens;
}

std::string byte_level(const std::string& bytes) {
  std::string mapped;
  for (const char c : bytes) mapped += byte_to_char()[static_cast<unsigned char>(c)];
  return mapped;
}

/// Every split of a token into two tokens, ordered by the token's rank, then
/// the left's and the right's (transformers' TikTokenConverter's order).
json merges_of(const std::vector<std::string>& tokens, const std::unordered_map<std::string, int32_t>& rank) {
  std::vector<std::tuple<int32_t, int32_t, int32_t>> merges;  // token, left, right
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& s = tokens[t];
    for (size_t cut = 1; cut < s.size(); ++cut) {
      const auto left = rank.find(s.substr(0, cut));
      if (left == rank.end()) continue;
      const auto right = rank.find(s.substr(cut));
      if (right != rank.end()) merges.emplace_back(int32_t(t), left->second, right->second);
    }
  }
  std::sort(merges.begin(), merges.end());
  json out = json::array();
  for (const auto& [t, l, r] : merges) out.push_back({byte_level(tokens[size_t(l)]), byte_level(tokens[size_t(r)])});
  return out;
}

}  // namespace

bool looks_like_tiktoken(const std::string& head) {
  const size_t space = head.find(' ');
  const size_t end = head.find('\n');
  return space != std::string::npos && end != std::string::npos && space < end &&
         base64_decode(head.substr(0, space)).has_value();
}

json tiktoken_as_tokenizer_json(const std::string& file) {
  const std::vector<std::string> tokens = read_ranks(file);
  std::unordered_map<std::string, int32_t> rank;
  rank.reserve(tokens.size());
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    TORCH_CHECK_VALUE(rank.emplace(tokens[i], int32_t(i)).second, "rank ", i, " repeats the bytes of rank ",
                      rank[tokens[i]]);
    vocab[byte_level(tokens[i])] = i;
  }
  json added = json::array();
  const auto specials = llama3_special_tokens();
  for (size_t i = 0; i < specials.size(); ++i) {
    added.push_back({{"id", tokens.size() + i}, {"content", specials[i]}, {"special", true}, {"normalized", false}});
  }
  const json byte_level_part = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                {"use_regex", false}};
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges_of(tokens, rank)}, {"ignore_merges", true}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        byte_level_part}}};
  j["decoder"] = byte_level_part;
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", specials[0]}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{specials[0], {{"id", specials[0]}, {"ids", {tokens.size()}}}}}}};
  j["added_tokens"] = added;
  return j;
}

}  // namespace strata::recipes::tokenizer
