// The pre-tokenizers of tokenizer.json: ByteLevel, Split, Metaspace, Digits
// and Sequence, each splitting as HF tokenizers does.
#include "strata/recipes/data/tokenizer/pipeline.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

namespace strata::recipes::tokenizer {

namespace {

using json = nlohmann::json;

/// GPT-2's pattern (its encoder.py), which ByteLevel runs with use_regex.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_of(const std::string& name) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail(c10::str("split behavior '", name,
                    "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous"));
}

struct Span {
  size_t begin, end;
  bool match;
};

/// tokenizers' NormalizedString::split: the text cut at `matches`, the
/// pieces grouped by `behavior`.
std::vector<std::pair<size_t, size_t>> split_spans(size_t size, const std::vector<std::pair<size_t, size_t>>& matches,
                                                   Behavior behavior, bool invert) {
  std::vector<Span> spans;
  size_t last = 0;
  for (const auto& [b, e] : matches) {
    if (b > last) spans.push_back({last, b, invert});
    spans.push_back({b, e, !invert});
    last = e;
  }
  if (last < size) spans.push_back({last, size, invert});
  std::vector<std::pair<size_t, size_t>> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const auto& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::kRemoved:
      for (const auto& s : spans)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.match && !previous_match && !out.empty()) out.back().second = s.end;
        else out.emplace_back(s.begin, s.end);
        previous_match = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous_match && !out.empty()) out.back().first = it->begin;
        else out.emplace_back(it->begin, it->end);
        previous_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].match == previous_match) out.back().second = spans[i].end;
        else out.emplace_back(spans[i].begin, spans[i].end);
        previous_match = spans[i].match;
      }
      break;
  }
  return out;
}

/// Every piece split at `regex`'s matches.
void split_all(std::vector<Piece>& pieces, const Regex& regex, Behavior behavior, bool invert, MatchScratch& scratch) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (auto& p : pieces) {
    const auto spans = split_spans(p.text.size(), regex.find_all(p.text, scratch), behavior, invert);
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].second > spans[i].first) {
        out.push_back({p.text.substr(spans[i].first, spans[i].second - spans[i].first), p.first && spans[i].first == 0});
      }
    }
  }
  pieces = std::move(out);
}

class ByteLevel : public PreTokenizer {
 public:
  explicit ByteLevel(const json& j)
      : add_prefix_space_(j.value("add_prefix_space", false)),
        regex_(j.value("use_regex", true) ? std::make_unique<Regex>(kGpt2Pattern) : nullptr) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    if (add_prefix_space_) {
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, 1, ' ');
    }
    if (regex_) split_all(pieces, *regex_, Behavior::kIsolated, false, scratch);
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Split : public PreTokenizer {
 public:
  explicit Split(const json& j)
      : regex_(make_regex(j.at("pattern"))),
        behavior_(behavior_of(j.at("behavior").get<std::string>())),
        invert_(j.value("invert", false)) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    split_all(pieces, *regex_, behavior_, invert_, scratch);
  }

 private:
  static std::unique_ptr<Regex> make_regex(const json& pattern) {
    if (pattern.contains("Regex")) return std::make_unique<Regex>(pattern["Regex"].get<std::string>());
    TORCH_CHECK_VALUE(pattern.contains("String"), "a Split pattern is neither String nor Regex");
    return std::make_unique<Regex>("\\Q" + pattern["String"].get<std::string>() + "\\E");
  }
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

class Metaspace : public PreTokenizer {
 public:
  explicit Metaspace(const json& j)
      : replacement_(j.value("replacement", std::string(kMetaspace))),
        scheme_(j.contains("prepend_scheme") ? j["prepend_scheme"].get<std::string>()
                                             : (j.value("add_prefix_space", true) ? "always" : "never")),
        split_(j.value("split", true)),
        delimiter_(split_ ? std::make_unique<Regex>("\\Q" + replacement_ + "\\E") : nullptr) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    for (auto& p : pieces) {
      std::string text;
      for (char c : p.text) {
        if (c == ' ') text += replacement_;
        else text += c;
      }
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && p.first);
      if (prepend && text.compare(0, replacement_.size(), replacement_) != 0) text.insert(0, replacement_);
      p.text = std::move(text);
    }
    if (delimiter_) split_all(pieces, *delimiter_, Behavior::kMergedWithNext, false, scratch);
  }

 private:
  std::string replacement_, scheme_;
  bool split_;
  std::unique_ptr<Regex> delimiter_;
};

class Digits : public PreTokenizer {
 public:
  explicit Digits(const json& j) : regex_(j.value("individual_digits", false) ? "[0-9]" : "[0-9]+") {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    split_all(pieces, regex_, Behavior::kIsolated, false, scratch);
  }

 private:
  Regex regex_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const override {
    for (const auto& p : parts_) p->apply(pieces, scratch);
  }
  bool byte_level() const override {
    for (const auto& p : parts_)
      if (p->byte_level()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j) {
  if (j.is_null()) return nullptr;
  TORCH_CHECK_VALUE(j.is_object() && j.contains("type"), "the pre_tokenizer has no \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j);
  if (type == "Split") return std::make_unique<Split>(j);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j);
  if (type == "Digits") return std::make_unique<Digits>(j);
  // Whitespace: words and runs of punctuation, whitespace dropped; WhitespaceSplit: what whitespace separates.
  if (type == "Whitespace" || type == "WhitespaceSplit") {
    return std::make_unique<Split>(json{{"pattern", {{"Regex", type == "Whitespace" ? "\\w+|[^\\w\\s]+" : "\\S+"}}},
                                        {"behavior", "Removed"},
                                        {"invert", true}});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& p : j.at("pretokenizers")) parts.push_back(make_pre_tokenizer(p));
    return std::make_unique<Sequence>(std::move(parts));
  }
  fail(c10::str("pre_tokenizer type '", type,
                    "' is not supported; supported: ByteLevel, Split, Metaspace, Digits, Sequence"));
}

}  // namespace strata::recipes::tokenizer
