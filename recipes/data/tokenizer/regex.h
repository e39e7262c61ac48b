#pragma once
// The pre-tokenizers' regular expressions, on PCRE2 (Debian's libpcre2-8).
//
// Why PCRE2: tokenizer.json's Split patterns (GPT-2's, Llama 3's, Qwen2's)
// use Unicode properties (\p{L}, \p{N}), inline flags ((?i:'s|'t)) and
// look-ahead (\s+(?!\S)), which std::regex cannot run. HF tokenizers runs
// them on Oniguruma; PCRE2 with UTF and UCP accepts the same syntax and
// classes (\s takes U+0085, NBSP and U+3000 in both: the parity test's
// corpus has them), and its JIT makes the split a small part of encoding.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::recipes::tokenizer {

/// What one thread needs to match: PCRE2's match data and a JIT stack.
class MatchScratch;

class Regex {
 public:
  /// Compiles `pattern` (UTF-8, Oniguruma/PCRE syntax) with UTF, UCP and
  /// JIT; c10::ValueError naming the pattern and PCRE2's message and offset
  /// when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// Every non-overlapping match of the pattern in `text` (valid UTF-8), as
  /// [begin, end) byte offsets, left to right; an empty match advances one
  /// character and is not reported.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text, MatchScratch& scratch) const;

  const std::string& pattern() const { return pattern_; }
  void* code() const { return code_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  ///< pcre2_code_8*
};

class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  /// Match data sized for `regex` (grown on first use with another pattern).
  void* match_data_for(const Regex& regex);
  void* context() const { return context_; }

 private:
  void* context_ = nullptr;    ///< pcre2_match_context_8*
  void* jit_stack_ = nullptr;  ///< pcre2_jit_stack_8*
  std::vector<std::pair<const Regex*, void*>> data_;  ///< per pattern: pcre2_match_data_8*
};

/// Whether `text` is valid UTF-8; else the offset of the first bad byte in `bad`.
bool valid_utf8(std::string_view text, size_t* bad = nullptr);

}  // namespace strata::recipes::tokenizer
