#pragma once
// TrainingModule: the user's model as the Trainer sees it (Lightning's
// LightningModule, reduced to what a C++ training loop needs).
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace strata {

/// One micro-batch: token ids and next-token targets (-1 = ignored position).
struct Batch {
  torch::Tensor input;   ///< int64 [B, T]
  torch::Tensor target;  ///< int64 [B, T], -1 where no loss is taken
};

/// What validation_step returns for one batch; sums, so that ranks and batches
/// combine exactly.
struct ValidationStep {
  double loss_sum = 0.0;       ///< sum of per-token losses over scored positions
  int64_t tokens = 0;          ///< scored positions
  int64_t correct_samples = 0; ///< samples whose every scored position is right
  int64_t samples = 0;
};

class TrainingModule {
 public:
  virtual ~TrainingModule() = default;

  /// The root module; strategies read and wrap its parameters.
  virtual torch::nn::Module& module() = 0;

  /// Forward + loss for one micro-batch; returns the scalar mean loss.
  virtual torch::Tensor training_step(const Batch& batch) = 0;

  /// Forward without grad; called under torch::NoGradGuard.
  virtual ValidationStep validation_step(const Batch& batch) = 0;

  /// Submodules FSDP shards (and activation checkpointing wraps) one by one,
  /// e.g. the transformer blocks. Empty: the whole model is one unit.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() { return {}; }

  /// Training FLOPs per token (forward + backward), for MFU; 0 if unknown.
  virtual double flops_per_token() const { return 0.0; }
};

}  // namespace strata
