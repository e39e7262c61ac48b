#pragma once
// Data sources for the GPT recipes. All deterministic from the seed and the
// sample index (see trainer/data_source.h for the sharding contract).
//
//  * AdditionData  — the built-in default: "123+456=" followed by the sum's
//    digits reversed ("975" + "0" -> "9750"), loss only on the answer. The
//    held-out split is a disjoint set of (a, b) pairs; accuracy = exact match.
//  * TextBytesData — any UTF-8 text file, byte-level (vocab 256); the last 10%
//    of the bytes are held out.
//  * TokenBinData  — nanoGPT's train.bin / val.bin (little-endian uint16).
#include "strata/trainer/data_source.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::recipes {

class AdditionData : public DataSource {
 public:
  /// `digits` per operand (1..9); `seed` picks the train/val split and samples.
  AdditionData(int digits, uint64_t seed);
  std::string name() const override;
  Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override;
  Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override;
  Batch spread_val_batch(int64_t index, int64_t batch_size, ShardInfo shard, int64_t used) const override;
  int64_t num_val_samples() const override;
  int64_t vocab_size() const override { return 12; }  // 0-9, '+', '='
  int64_t block_size() const override;
  bool has_accuracy() const override { return true; }

  /// "123+456=9750" -> token ids; exposed for tests and demos.
  std::vector<int64_t> encode_problem(int64_t a, int64_t b) const;
  /// True when the pair (a, b) belongs to the held-out split.
  bool is_val_pair(int64_t a, int64_t b) const;
  int digits() const { return digits_; }

 private:
  int digits_;
  uint64_t seed_;
};

/// A read-only run of tokens and what keeps it alive (a vector it owns, or a
/// memory mapping).
template <typename Token>
struct TokenSpan {
  const Token* data = nullptr;
  size_t count = 0;
  std::shared_ptr<const void> owner;
  size_t size() const { return count; }
  const Token& operator[](size_t i) const { return data[i]; }
  /// A span owning `tokens`.
  static TokenSpan of(std::vector<Token> tokens) {
    auto held = std::make_shared<const std::vector<Token>>(std::move(tokens));
    return {held->data(), held->size(), held};
  }
  /// Tokens [begin, end) of this span, sharing its owner.
  TokenSpan slice(size_t begin, size_t end) const { return {data + begin, end - begin, owner}; }
};

/// Windows of block_size + 1 tokens over a token array with a held-out part:
/// train windows start at hashed offsets, held-out windows are evenly spaced.
/// Shared by TextBytesData (bytes), TokenBinData (uint16 tokens) and
/// TokenizedData (a tokenized corpus, uint16 or uint32, memory-mapped).
template <typename Token>
class WindowData : public DataSource {
 public:
  Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override;
  Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override;
  Batch spread_val_batch(int64_t index, int64_t batch_size, ShardInfo shard, int64_t used) const override;
  /// min(1024, number of distinct held-out windows).
  int64_t num_val_samples() const override;
  int64_t block_size() const override { return block_size_; }

 protected:
  WindowData(int64_t block_size, uint64_t seed) : block_size_(block_size), seed_(seed) {}
  TokenSpan<Token> train_;
  TokenSpan<Token> val_;
  int64_t block_size_;
  uint64_t seed_;
};

class TextBytesData : public WindowData<uint8_t> {
 public:
  /// Reads the whole file; errors (one line, naming the path) if it is missing,
  /// unreadable, empty, or too short for `block_size`.
  TextBytesData(const std::string& path, int64_t block_size, uint64_t seed);
  std::string name() const override;
  int64_t vocab_size() const override { return 256; }

 private:
  std::string path_;
};

class TokenBinData : public WindowData<uint16_t> {
 public:
  /// `dir` holds train.bin and val.bin (uint16 tokens). Errors if a file is
  /// missing/empty, has an odd byte length, holds a token >= vocab_size, or is
  /// shorter than block_size + 1 tokens.
  TokenBinData(const std::string& dir, int64_t block_size, int64_t vocab_size, uint64_t seed);
  std::string name() const override;
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  std::string dir_;
  int64_t vocab_size_;
};

/// The first global sample of micro-batch `index` for `shard` (checked),
/// and the hash the windows draw samples with: for other sources that keep
/// the same sharding contract (data/instruct.h).
int64_t first_sample_of(int64_t index, int64_t batch_size, ShardInfo shard);
uint64_t sample_hash(uint64_t key, uint64_t counter);

/// "addition" (default digits), "addition:N", a directory with train.bin/val.bin,
/// or a text file. block_size <= 0 means "the data's natural length" (addition)
/// or 256 (text/bin).
std::unique_ptr<DataSource> make_data(const std::string& spec, int64_t block_size,
                                      int64_t vocab_size, uint64_t seed);

}  // namespace strata::recipes
