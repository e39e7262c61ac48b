#include "strata/recipes/data/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <c10/util/Exception.h>

namespace strata::recipes::tokenizer {

namespace {

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    TORCH_CHECK_VALUE(false, "pre-tokenizer pattern '", pattern, "' does not compile: ",
                      reinterpret_cast<const char*>(message), " at offset ", offset);
  }
  // Without a JIT (an unsupported CPU) the interpreter runs the same pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(as_code(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text, MatchScratch& scratch) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* data = static_cast<pcre2_match_data*>(scratch.match_data_for(*this));
  auto* context = static_cast<pcre2_match_context*>(scratch.context());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    // The text was checked once (valid_utf8): no per-match UTF check.
    const int rc = pcre2_match(as_code(code_), subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    TORCH_CHECK(rc >= 0, "pre-tokenizer pattern '", pattern_, "' failed on a text of ", text.size(),
                " bytes (PCRE2 error ", rc, ")");
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one UTF-8 character.
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  return out;
}

MatchScratch::MatchScratch() {
  auto* context = pcre2_match_context_create(nullptr);
  // Long runs of spaces under \s+(?!\S) recurse deeply: 1-16 MiB of JIT stack.
  auto* stack = pcre2_jit_stack_create(1 << 20, 16 << 20, nullptr);
  pcre2_jit_stack_assign(context, nullptr, stack);
  context_ = context;
  jit_stack_ = stack;
}

MatchScratch::~MatchScratch() {
  for (auto& [regex, data] : data_) pcre2_match_data_free(static_cast<pcre2_match_data*>(data));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
}

void* MatchScratch::match_data_for(const Regex& regex) {
  for (auto& [r, data] : data_) {
    if (r == &regex) return data;
  }
  data_.emplace_back(&regex, pcre2_match_data_create_from_pattern(as_code(regex.code()), nullptr));
  return data_.back().second;
}

bool valid_utf8(std::string_view text, size_t* bad) {
  size_t i = 0;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  while (i < n) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else { if (bad) *bad = i; return false; }
    if (i + len > n) { if (bad) *bad = i; return false; }
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) { if (bad) *bad = i; return false; }
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { if (bad) *bad = i; return false; }
    i += len;
  }
  return true;
}

}  // namespace strata::recipes::tokenizer
