#pragma once
// DataSource: where the Trainer gets micro-batches. Deterministic by index so
// that (a) a resumed run sees the same data and (b) N ranks with batch B see
// exactly the samples one process with batch N·B sees.
#include "core/training_module.h"

#include <cstdint>
#include <string>

namespace strata {

struct ShardInfo {
  int rank = 0;
  int world_size = 1;
};

class DataSource {
 public:
  virtual ~DataSource() = default;

  virtual std::string name() const = 0;

  /// Micro-batch number `index` (a global counter, step * accumulation + micro)
  /// for `shard`: rows [rank*B, (rank+1)*B) of the global batch of
  /// batch_size * world_size samples whose first sample is index*B*world_size.
  /// Shards are disjoint, and their union is the single-process batch.
  virtual Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const = 0;

  /// Held-out batch number `index`, sharded the same way.
  virtual Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const = 0;

  /// Number of held-out samples (validation stops at this many).
  virtual int64_t num_val_samples() const = 0;

  /// Vocabulary size the data needs, and the sequence length of a sample.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t block_size() const = 0;

  /// True when validation_step's exact-match accuracy means something.
  virtual bool has_accuracy() const { return false; }
};

}  // namespace strata
