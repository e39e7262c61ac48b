#pragma once
// Tokenizers, in C++, as transformers tokenizes: a Hugging Face
// tokenizer.json with a BPE model, byte-level (GPT-2, Llama 3, Qwen2/2.5/3,
// SmolLM2) or SentencePiece-style with byte fallback (Llama 2, TinyLlama,
// Mistral, Phi-3). The ids equal the PyPI `tokenizers` library's for the
// same file (tests/recipes/data/tokenizer_test.cpp checks six real files).
//
//   auto tok = strata::recipes::load_tokenizer("Llama-3.2-1B/");  // or .../tokenizer.json
//   std::vector<int32_t> ids = tok->encode("Hello world");          // {9906, 1917}
//   std::string text = tok->decode(ids);                            // "Hello world"
//
// Added and special tokens written in the text are matched before anything
// else (as tokenizers does, also without add_special_tokens). encode() is
// thread-safe; a TokenizerScratch per thread keeps its word cache and regex
// state (encode without one makes a fresh one).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::recipes {

/// What one thread reuses between encode() calls (a cache of pre-tokens'
/// ids, the regex engine's state). Made by Tokenizer::make_scratch().
class TokenizerScratch {
 public:
  virtual ~TokenizerScratch() = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The ids of `text` (UTF-8; c10::ValueError naming the first bad byte
  /// otherwise); with `add_special_tokens` the post-processor's tokens
  /// around them (Llama's BOS).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens,
                                      TokenizerScratch& scratch) const = 0;
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  /// The text of `ids` (an id out of range: c10::ValueError naming it).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const = 0;
  virtual std::unique_ptr<TokenizerScratch> make_scratch() const = 0;
  /// One more than the largest id (vocabulary and added tokens).
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(const std::string& token) const = 0;
  /// The file it was read from.
  virtual const std::string& path() const = 0;
};

/// The file a tokenizer `path` names: the path itself, or a directory's
/// tokenizer.json, else its tokenizer.model; nullopt when it has neither.
std::optional<std::string> tokenizer_file(const std::string& path);

/// The tokenizer at `path`: a tokenizer.json, a tiktoken BPE file (Llama 3's
/// original tokenizer.model, read as Llama 3's; tiktoken.h), or a directory
/// holding one.
/// c10::ValueError, one line naming the file and what was expected, for a
/// missing, unreadable, oversized or malformed file or a part strata does
/// not run.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace strata::recipes
