#pragma once
// SDPStrategy ("sdp", alias "zero2"): sharded data parallel (ZeRO-2).
//
// Sharded: optimizer state and gradients (same FlatLayout partition as OSS).
// Communicated per step: gradients reduced to their owner in buckets of
// bucket_cap_mb, from gradient hooks while backward is still running (Ψ);
// updated parameters all-gathered after the step (Ψ): 2Ψ in all.
// As soon as a bucket's gradients are copied into its send buffer they are
// freed, so a rank holds its owned gradient shard plus at most
// kMaxBucketsInFlight buckets. Model state per rank with fp32 AdamW:
// 4Ψ' params + 12Ψ'/N (grads + state).
#include "strata/strategies/oss/oss.h"

#include <deque>
#include <memory>

namespace strata {

class SDPStrategy : public OSSStrategy {
 public:
  /// Bucket sends in flight before the autograd thread waits for the oldest:
  /// bounds gradient memory while still overlapping with backward.
  static constexpr size_t kMaxBucketsInFlight = 2;

  SDPStrategy(Comm comm, ShardOptions options = {});
  std::string name() const override { return "sdp"; }

  void reduce_gradients() override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;

 protected:
  void setup_gradients() override;
  torch::Tensor owned_grad() const override { return shard_grad_; }

 private:
  struct BucketSend {
    torch::Tensor staging;            // the bucket's summed-locally gradients
    std::vector<PendingWork> works;   // one reduce per owner rank it spans
    int64_t flat_begin = 0;           // staging[0] is this flat element
  };
  void launch_bucket(size_t bucket);
  void finish_oldest();

  torch::Tensor shard_grad_;
  std::deque<BucketSend> in_flight_;
};

/// How "sdp" (alias zero2) registers (strategies/spec.h): oss's options and
/// offload.
StrategySpec sdp_spec();

}  // namespace strata
