#pragma once
// StepRunner: how one optimizer step's micro-batches run their forwards and
// backwards (issue 47's trainer seam). The Trainer draws a step's
// micro-batches and hands them here; so does the dry run, so both run the
// same code. The default, SequentialSteps, is gradient accumulation: each
// micro-batch's forward and backward in turn, the strategy's no_sync() on all
// but the last. A pipeline (strategies/pp/pipeline_parallel.h) runs a
// schedule of them across its stages' ranks instead.
//
// Example (what Trainer::run_step does):
//   auto losses = strategy.step_runner().forward_backward(strategy, module, batches, context, times);
//   strategy.reduce_gradients();
//   strategy.step_runner().after_gradient_sync(strategy);
#include "strata/core/precision.h"
#include "strata/core/training_module.h"

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace strata {

class Strategy;

/// What the caller of a step asks around each micro-batch; every member may
/// be empty.
struct MicroBatchHooks {
  /// The flight recorder's phase ("forward", "backward").
  std::function<void(const char* phase)> phase;
  /// Before the backward of a micro-batch's loss (the Trainer's callbacks).
  std::function<void(const torch::Tensor& loss)> before_backward;
  std::function<void()> after_backward;
};

struct StepContext {
  /// The gradients are of the loss times this (fp16 loss scaling; 1 otherwise).
  double loss_scale = 1.0;
  Precision precision = Precision::kFp32;
  MicroBatchHooks hooks;
};

/// Seconds of one step's forwards and backwards on this rank.
struct MicroBatchTimes {
  double forward_s = 0.0;             ///< forwards, without the comm waits inside them
  double backward_s = 0.0;            ///< backwards, wall time
  double backward_compute_s = 0.0;    ///< backwards without the comm waits inside them
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  /// Forward and backward of every micro-batch in `batches` (one optimizer
  /// step's, on the strategy's device): the gradients of the mean of their
  /// losses, times context.loss_scale, accumulate in the module's
  /// parameters. Returns each micro-batch's loss (unscaled), the same on
  /// every rank that runs the same micro-batches.
  virtual std::vector<double> forward_backward(Strategy& strategy, TrainingModule& module,
                                               const std::vector<Batch>& batches, const StepContext& context,
                                               MicroBatchTimes& times) = 0;
  /// After the strategy's reduce_gradients(), before clipping: what the
  /// runner adds to the gradients' sync (a pipeline: tied weights' gradients
  /// summed between stages). Nothing by default.
  virtual void after_gradient_sync(Strategy& strategy) {}
  /// One held-out batch's sums (under torch::NoGradGuard and the precision's
  /// autocast): the strategy's validation_step by default.
  virtual ValidationStep validation_step(Strategy& strategy, TrainingModule& module, const Batch& batch);
};

/// Gradient accumulation: forward and backward of each micro-batch in turn,
/// gradients synced on the last one only (Strategy::no_sync on the others).
class SequentialSteps : public StepRunner {
 public:
  std::vector<double> forward_backward(Strategy& strategy, TrainingModule& module, const std::vector<Batch>& batches,
                                       const StepContext& context, MicroBatchTimes& times) override;
};

}  // namespace strata
