#pragma once
// DataSource: where the Trainer gets micro-batches. Deterministic by index so
// that (a) a resumed run sees the same data and (b) N ranks with batch B see
// exactly the samples one process with batch N·B sees.
#include "strata/core/training_module.h"

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

  /// Held-out batch `index` of a validation that uses `used` samples in all
  /// (limit_val_batches x the global batch): global sample j is held-out
  /// sample floor(j * num_val_samples() / used), so a partial validation
  /// spreads evenly over the whole held-out set -- the same samples at every
  /// world size with the same global batch. With used >= num_val_samples()
  /// it is val_batch(). The default ignores `used` (held-out samples
  /// 0..used-1), for sources whose held-out set has no order to spread over.
  virtual Batch spread_val_batch(int64_t index, int64_t batch_size, ShardInfo shard, int64_t used) const {
    (void)used;
    return val_batch(index, batch_size, shard);
  }

  /// Number of held-out samples (validation stops at this many).
  virtual int64_t num_val_samples() const = 0;

  /// Vocabulary size the data needs, and the sequence length of a sample.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t block_size() const = 0;

  /// True when validation_step's exact-match accuracy means something.
  virtual bool has_accuracy() const { return false; }
};

}  // namespace strata
