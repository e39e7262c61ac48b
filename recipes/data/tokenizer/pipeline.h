#pragma once
// tokenizer.json's text pipeline around the model, each part as HF
// tokenizers runs it: normalizers (NFC and the other Unicode forms through
// utf8proc, Prepend, Replace, Lowercase, Strip, Sequence), pre-tokenizers
// (ByteLevel, Split, Metaspace, Digits, Sequence), decoders (ByteLevel,
// Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence) and the
// post-processor's special tokens around one sequence (TemplateProcessing,
// ByteLevel, Sequence). A type strata does not run is refused naming it and
// the ones it runs.
#include "strata/recipes/data/tokenizer/regex.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata::recipes::tokenizer {

/// A part of the text on its way to the model, and whether it starts the
/// text (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool first = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(const std::string& text, MatchScratch& scratch) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Splits (and rewrites) `pieces` in place.
  virtual void apply(std::vector<Piece>& pieces, MatchScratch& scratch) const = 0;
  /// Whether the model sees the pieces as GPT-2's byte-level characters.
  virtual bool byte_level() const { return false; }
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// HF's decode_chain: the tokens' text, token by token.
  virtual std::vector<std::string> apply(std::vector<std::string> tokens) const = 0;
};

/// Throws c10::ValueError with `message` (a tokenizer.json part strata does not run).
[[noreturn]] void fail(const std::string& message);

/// `v` as a whole number in [0, max]; else fail() naming `what`. Why not
/// json::get<int>(): it casts a float out of range (undefined behaviour) and
/// wraps a larger integer into a wrong id (both found by fuzzing).
int64_t whole_in(const nlohmann::json& v, int64_t max, const std::string& what);
/// A vocabulary {token: id}, each id checked by whole_in.
std::unordered_map<std::string, int32_t> read_vocab(const nlohmann::json& v, const std::string& what);

/// null JSON: none (nullptr).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j);

/// The ids the post-processor puts before and after one sequence.
struct SpecialAround {
  std::vector<int32_t> before, after;
};
/// `token_id` resolves a template's token names.
SpecialAround make_post_processor(const nlohmann::json& j, const std::map<std::string, int32_t>& special_ids);

/// GPT-2's byte <-> character map: bytes_to_unicode() of its encoder.py.
const std::vector<std::string>& byte_to_char();
/// The bytes of a byte-level character string (a character outside the map
/// keeps its own UTF-8 bytes).
std::string chars_to_bytes(const std::string& text);

/// `text` with every invalid UTF-8 sequence replaced by U+FFFD, as Rust's
/// String::from_utf8_lossy does.
std::string utf8_lossy(const std::string& text);

}  // namespace strata::recipes::tokenizer
