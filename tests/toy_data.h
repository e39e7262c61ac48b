#pragma once
// ToyData: a tiny learnable DataSource for tests that must not depend on the
// recipes' data (sequences x_{t+1} = (3 x_t + 1) mod V from a hashed start),
// deterministic by sample index and honouring the sharding contract.
#include "strata/trainer/data_source.h"

#include <torch/torch.h>

namespace strata::testing {

class ToyData : public DataSource {
 public:
  explicit ToyData(int64_t vocab = 16, int64_t block = 8, uint64_t seed = 7)
      : vocab_(vocab), block_(block), seed_(seed) {}
  std::string name() const override { return "toy"; }
  Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    return make(index * batch_size * shard.world_size + shard.rank * batch_size, batch_size, 0);
  }
  Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    return make(index * batch_size * shard.world_size + shard.rank * batch_size, batch_size, 1);
  }
  int64_t num_val_samples() const override { return 64; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t block_size() const override { return block_; }
  bool has_accuracy() const override { return true; }

 private:
  Batch make(int64_t first, int64_t batch_size, uint64_t stream) const {
    auto input = torch::empty({batch_size, block_}, torch::kInt64);
    auto target = torch::empty({batch_size, block_}, torch::kInt64);
    auto in = input.accessor<int64_t, 2>();
    auto tg = target.accessor<int64_t, 2>();
    for (int64_t b = 0; b < batch_size; ++b) {
      uint64_t h = (seed_ * 0x9E3779B97F4A7C15ULL) ^ (static_cast<uint64_t>(first + b) * 0xBF58476D1CE4E5B9ULL) ^ (stream << 60);
      h ^= h >> 31;
      h *= 0x94D049BB133111EBULL;
      h ^= h >> 29;
      int64_t x = static_cast<int64_t>(h % static_cast<uint64_t>(vocab_));
      for (int64_t t = 0; t < block_; ++t) {
        in[b][t] = x;
        x = (3 * x + 1) % vocab_;
        tg[b][t] = x;
      }
    }
    return {input, target};
  }
  int64_t vocab_;
  int64_t block_;
  uint64_t seed_;
};

}  // namespace strata::testing
