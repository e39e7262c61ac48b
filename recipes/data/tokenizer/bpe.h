#pragma once
// The BPE model of a tokenizer.json ("model": {"type": "BPE"}), as HF
// tokenizers runs it: a pre-token's characters become symbols (a character
// missing from the vocabulary becomes its <0xXX> byte tokens with
// byte_fallback, else the unknown token, fused with a neighbouring one under
// fuse_unk); then the pair of adjacent symbols with the lowest merge rank is
// merged, leftmost first, until no pair has a merge. With ignore_merges a
// pre-token that is itself in the vocabulary is that token (Llama 3).
// WordLevel ("type": "WordLevel") maps each pre-token to its id, or the
// unknown token.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::recipes::tokenizer {

struct BpeOptions {
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::optional<int32_t> unk_id;
};

/// A tokenizer.json "model": pre-tokens to ids.
class TokenModel {
 public:
  virtual ~TokenModel() = default;
  /// Appends the ids of one pre-token, spelled as the vocabulary spells it
  /// (a byte-level tokenizer's pre-tokens are already mapped to its characters).
  virtual void encode(std::string_view word, std::vector<int32_t>& out) const = 0;
  virtual const std::unordered_map<std::string, int32_t>& vocab() const = 0;
};

class WordLevel : public TokenModel {
 public:
  WordLevel(std::unordered_map<std::string, int32_t> vocab, std::optional<int32_t> unk_id)
      : vocab_(std::move(vocab)), unk_id_(unk_id) {}
  void encode(std::string_view word, std::vector<int32_t>& out) const override;
  const std::unordered_map<std::string, int32_t>& vocab() const override { return vocab_; }

 private:
  std::unordered_map<std::string, int32_t> vocab_;
  std::optional<int32_t> unk_id_;
};

class Bpe : public TokenModel {
 public:
  /// Merges by rank (first = highest priority); each pair's concatenation
  /// must be in `vocab`. c10::ValueError naming the merge otherwise.
  Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options);

  void encode(std::string_view word, std::vector<int32_t>& out) const override;
  const std::unordered_map<std::string, int32_t>& vocab() const override { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  int32_t byte_ids_[256];  ///< "<0xXX>" ids for byte_fallback (-1: absent)
};

}  // namespace strata::recipes::tokenizer
