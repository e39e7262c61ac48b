// Normalizers, decoders and the post-processor of tokenizer.json (the
// pre-tokenizers: pre_tokenizers.cpp).
#include "strata/recipes/data/tokenizer/pipeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <utf8proc.h>

#include <cstdlib>

namespace strata::recipes::tokenizer {

namespace {

using json = nlohmann::json;

std::string type_of(const json& j, const char* part) {
  TORCH_CHECK_VALUE(j.is_object() && j.contains("type") && j["type"].is_string(), "", part,
                    " has no \"type\"");
  return j["type"].get<std::string>();
}

/// Every occurrence of `from` in `text` replaced by `to`.
std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  std::string out;
  size_t start = 0;
  for (size_t at; (at = text.find(from, start)) != std::string::npos; start = at + from.size()) {
    out.append(text, start, at - start).append(to);
  }
  return out.append(text, start, std::string::npos);
}

/// A Replace's pattern: {"String": s} or {"Regex": r}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  explicit Pattern(const json& j) {
    if (j.contains("String")) literal = j["String"].get<std::string>();
    else if (j.contains("Regex")) regex = std::make_unique<Regex>(j["Regex"].get<std::string>());
    else fail(c10::str("a Replace pattern is neither {\"String\": ...} nor {\"Regex\": ...}"));
  }
  std::string replace(const std::string& text, const std::string& content, MatchScratch& scratch) const {
    if (!regex) return replace_all(text, literal, content);
    std::string out;
    size_t last = 0;
    for (const auto& [b, e] : regex->find_all(text, scratch)) {
      out.append(text, last, b - last).append(content);
      last = e;
    }
    return out.append(text, last, std::string::npos);
  }
};

// ---- normalizers ----

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  std::string apply(const std::string& text, MatchScratch&) const override {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()),
                                &out, utf8proc_option_t(options_));
    TORCH_CHECK_VALUE(n >= 0, "Unicode normalization failed: ", utf8proc_errmsg(n));
    std::string result(reinterpret_cast<const char*>(out), size_t(n));
    std::free(out);
    return result;
  }

 private:
  int options_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(const std::string& text, MatchScratch&) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  explicit ReplaceNormalizer(const json& j) : pattern_(j.at("pattern")), content_(j.at("content").get<std::string>()) {}
  std::string apply(const std::string& text, MatchScratch& scratch) const override {
    return pattern_.replace(text, content_, scratch);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Lowercase : public Normalizer {
 public:
  std::string apply(const std::string& text, MatchScratch&) const override {
    std::string out;
    utf8proc_int32_t cp = 0;
    for (size_t i = 0; i < text.size();) {
      const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                      utf8proc_ssize_t(text.size() - i), &cp);
      TORCH_CHECK_VALUE(n > 0, "Lowercase: invalid UTF-8 at byte ", i);
      utf8proc_uint8_t buf[4];
      out.append(reinterpret_cast<const char*>(buf), size_t(utf8proc_encode_char(utf8proc_tolower(cp), buf)));
      i += size_t(n);
    }
    return out;
  }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  std::string apply(const std::string& text, MatchScratch& scratch) const override {
    std::string out = text;
    for (const auto& p : parts_) out = p->apply(out, scratch);
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---- decoders ----

class ByteLevelDecoder : public Decoder {
 public:
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) bytes += chars_to_bytes(t);
    return {utf8_lossy(bytes)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    // As tokenizers: in the first token every replacement character goes
    // (prepend_scheme first/always), elsewhere each becomes a space.
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replace_all(tokens[i], replacement_, i == 0 && strip_first_ ? "" : " ");
    return tokens;
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  explicit ReplaceDecoder(const json& j) : pattern_(j.at("pattern")), content_(j.at("content").get<std::string>()) {}
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    MatchScratch scratch;
    for (auto& t : tokens) t = pattern_.replace(t, content_, scratch);
    return tokens;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class ByteFallbackDecoder : public Decoder {
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

 public:
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        std::string marks;
        for (size_t k = 0; k < pending_count; ++k) marks += "\xEF\xBF\xBD";  // one U+FFFD per byte, as tokenizers
        out.push_back(marks);
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      // "<0xHH>": two hex digits, read in place (strtol on a temporary's
      // c_str() left its end pointer in a destroyed string: found by fuzzing).
      const bool byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex_digit(t[3]) >= 0 &&
                        hex_digit(t[4]) >= 0;
      if (byte) {
        pending += char(hex_digit(t[3]) * 16 + hex_digit(t[4]));
        ++pending_count;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    return out;
  }
};

class FuseDecoder : public Decoder {
 public:
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

class StripDecoder : public Decoder {
 public:
  explicit StripDecoder(const json& j)
      : content_(j.at("content").get<std::string>()),
        start_(whole_in(j.at("start"), INT32_MAX, "decoder Strip's start")),
        stop_(whole_in(j.at("stop"), INT32_MAX, "decoder Strip's stop")) {}
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t k = 0; k < start_ && t.compare(begin, content_.size(), content_) == 0 && begin < end; ++k) {
        begin += content_.size();
      }
      for (size_t k = 0; k < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
    return tokens;
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  std::vector<std::string> apply(std::vector<std::string> tokens) const override {
    for (const auto& p : parts_) tokens = p->apply(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

/// Metaspace's prepend_scheme (or the older add_prefix_space): "always", "first" or "never".
std::string prepend_scheme(const json& j) {
  if (j.contains("prepend_scheme")) return j["prepend_scheme"].get<std::string>();
  return j.value("add_prefix_space", true) ? "always" : "never";
}

}  // namespace

void fail(const std::string& message) { C10_THROW_ERROR(ValueError, message); }

int64_t whole_in(const json& v, int64_t max, const std::string& what) {
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max)) &&
                    v.get<int64_t>() >= 0 && v.get<int64_t>() <= max;
  if (!fits) fail(c10::str(what, " is ", v.dump(), "; expected a whole number from 0 to ", max));
  return v.get<int64_t>();
}

std::unordered_map<std::string, int32_t> read_vocab(const json& v, const std::string& what) {
  if (!v.is_object()) fail(c10::str(what, " is not an object {token: id}"));
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(v.size());
  for (const auto& [token, id] : v.items()) {
    vocab.emplace(token, static_cast<int32_t>(whole_in(id, INT32_MAX, what + " id of " + json(token).dump())));
  }
  return vocab;
}

std::unique_ptr<Normalizer> make_normalizer(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "a normalizer");
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Prepend") return std::make_unique<Prepend>(j.at("prepend").get<std::string>());
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(j);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& p : j.at("normalizers")) parts.push_back(make_normalizer(p));
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  fail(c10::str("normalizer type '", type,
                    "' is not supported; supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Lowercase, Sequence"));
}

std::unique_ptr<Decoder> make_decoder(const json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, "the decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(j.value("replacement", std::string("\xE2\x96\x81")),
                                              prepend_scheme(j) != "never");
  }
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(j);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(j);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& p : j.at("decoders")) parts.push_back(make_decoder(p));
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  fail(c10::str("decoder type '", type,
                    "' is not supported; supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence"));
}

SpecialAround make_post_processor(const json& j, const std::map<std::string, int32_t>& special_ids) {
  SpecialAround around;
  if (j.is_null()) return around;
  const std::string type = type_of(j, "the post_processor");
  if (type == "ByteLevel") return around;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) {
      const SpecialAround part = make_post_processor(p, special_ids);
      around.before.insert(around.before.end(), part.before.begin(), part.before.end());
      around.after.insert(around.after.end(), part.after.begin(), part.after.end());
    }
    return around;
  }
  TORCH_CHECK_VALUE(type == "TemplateProcessing", "post_processor type '", type,
                    "' is not supported; supported: TemplateProcessing, ByteLevel, Sequence");
  bool seen_sequence = false;
  for (const auto& piece : j.at("single")) {
    if (piece.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    std::vector<int32_t> ids;
    const auto& table = j.value("special_tokens", json::object());
    if (table.contains(name)) {
      ids = table[name].at("ids").get<std::vector<int32_t>>();
    } else {
      const auto it = special_ids.find(name);
      TORCH_CHECK_VALUE(it != special_ids.end(), "the post_processor names token '", name,
                        "', which the tokenizer does not have");
      ids = {it->second};
    }
    auto& side = seen_sequence ? around.after : around.before;
    side.insert(side.end(), ids.begin(), ids.end());
  }
  return around;
}

const std::vector<std::string>& byte_to_char() {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : next++;
      utf8proc_uint8_t buf[4];
      t[b].assign(reinterpret_cast<const char*>(buf), size_t(utf8proc_encode_char(cp, buf)));
    }
    return t;
  }();
  return table;
}

std::string chars_to_bytes(const std::string& text) {
  static const std::map<std::string, char> reverse = [] {
    std::map<std::string, char> r;
    for (int b = 0; b < 256; ++b) r[byte_to_char()[b]] = char(b);
    return r;
  }();
  // As tokenizers: a token all of whose characters map gives those bytes,
  // any other keeps its own (an added token such as "<|endoftext|>").
  std::string out;
  for (size_t i = 0; i < text.size();) {
    size_t len = 1;
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead >= 0xF0) len = 4;
    else if (lead >= 0xE0) len = 3;
    else if (lead >= 0xC0) len = 2;
    const auto it = reverse.find(text.substr(i, len));
    if (it == reverse.end()) return text;
    out += it->second;
    i += len;
  }
  return out;
}

std::string utf8_lossy(const std::string& text) {
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      out += char(c);
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n && s[j] >= lo && s[j] <= hi) {
      lo = 0x80, hi = 0xBF;
      ++j, ++got;
    }
    if (need > 0 && got == need) out.append(text, i, j - i);
    else out += "\xEF\xBF\xBD";  // the maximal invalid prefix: one U+FFFD, as Rust's from_utf8_lossy
    i = need == 0 ? i + 1 : j;
  }
  return out;
}

}  // namespace strata::recipes::tokenizer
