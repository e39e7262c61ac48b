#pragma once
// DDPStrategy ("ddp"): data parallel with a full replica on every rank.
//
// Sharded: nothing. Communicated per step: every gradient once, all-reduced
// (2Ψ bytes per rank in the ring model) in buckets of bucket_cap_mb (one dtype
// per bucket), in reverse registration order, launched from gradient hooks
// while backward is still running. Gradients live as views into the buckets
// (no second copy). Setup broadcasts rank 0's parameters and buffers.
// Parameters without a gradient: see grad_sync.h.
//
// Example:
//   auto ddp = std::make_shared<strata::DDPStrategy>(comm, strata::DDPOptions().bucket_cap_mb(25));
#include "strata/strategies/grad_sync.h"
#include "strata/strategies/spec.h"
#include "strata/strategies/strategy.h"

#include <memory>
#include <vector>

namespace strata {

struct DDPOptions {
  /// Bucket size; torch's default is 25 MiB. 0: no bucketing, one all-reduce
  /// per gradient (the naive baseline the bucketed design is measured against).
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Tolerate parameters that get no gradient (see grad_sync.h); otherwise
  /// such a parameter is an error naming it.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// true: all-reduce from the gradient hooks, overlapped with backward.
  /// false: all-reduce every bucket after backward (for comparison).
  TORCH_ARG(bool, overlap_comm) = true;
};

class DDPStrategy : public Strategy {
 public:
  DDPStrategy(Comm comm, DDPOptions options = {});
  std::string name() const override { return "ddp"; }

  void setup(TrainingModule& module) override;
  void backward(const torch::Tensor& loss) override;
  void reduce_gradients() override;
  void optimizer_step(torch::optim::Optimizer& optimizer) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  std::string describe() const override;

  const DDPOptions& options() const { return options_; }

 private:
  void launch_bucket(size_t bucket);
  void start_all_reduce(size_t bucket);

  DDPOptions options_;
  GradSync grad_sync_;
  std::vector<torch::Tensor> bucket_buffers_;
  std::vector<PendingWork> in_flight_;
  std::vector<size_t> deferred_;  // ready buckets held back when !overlap_comm
};

/// How "ddp" registers (strategies/spec.h): --bucket-cap-mb,
/// --find-unused-parameters, --overlap-comm; --offload keeps the optimizer
/// state in the tier. The reference strategy of benchmarks.
StrategySpec ddp_spec();

}  // namespace strata
