#pragma once
// Loss scaling for fp16 mixed precision (--precision 16-mixed).
//
// fp16 has too little range for gradients: the loss is multiplied by a scale
// before backward, the gradients are unscaled before clipping and the step,
// and a step whose gradients hold an inf or NaN is skipped. Dynamic scaling
// follows DeepSpeed's DynamicLossScaler, with its config names and defaults
// (fp16 block: loss_scale 0 = dynamic, initial_scale_power 16,
// loss_scale_window 1000, hysteresis 2, consecutive_hysteresis false,
// min_loss_scale 1): an overflow halves the scale once `hysteresis`
// overflows have been seen (each skips its step), and `loss_scale_window`
// clean steps after the last overflow double it. An overflow at the minimum
// scale is an error naming the step (DeepSpeed's raise_error_at_min_scale):
// training would otherwise go on skipping every step.
//
// The scaler decides from one bool per step that every rank must agree on:
// the Trainer takes it from the global gradient norm, which every strategy
// all-reduces when gradients are sharded (Strategy::clip_grad_norm).
//
//   DynamicLossScaler scaler(LossScalerOptions().initial_scale_power(16));
//   backward(loss * scaler.scale());
//   norm = strategy.clip_grad_norm(max, scaler.scale());  // unscales too
//   if (!scaler.update(!std::isfinite(norm), step)) strategy.optimizer_step(opt);
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace strata {

struct LossScalerOptions {
  /// > 0: a static scale (a non-finite step is still skipped); 0: dynamic.
  TORCH_ARG(double, loss_scale) = 0.0;
  /// Dynamic: the first scale is 2^initial_scale_power.
  TORCH_ARG(int64_t, initial_scale_power) = 16;
  /// Dynamic: clean steps after the last overflow before the scale doubles.
  TORCH_ARG(int64_t, loss_scale_window) = 1000;
  /// Dynamic: overflows it takes to halve the scale (each skips its step).
  TORCH_ARG(int64_t, hysteresis) = 2;
  /// Dynamic: a clean step restores the full hysteresis (else only growth does).
  TORCH_ARG(bool, consecutive_hysteresis) = false;
  /// Dynamic: the scale never goes below this; an overflow here is an error.
  TORCH_ARG(double, min_loss_scale) = 1.0;
};

class DynamicLossScaler {
 public:
  /// Checks the options (TORCH_CHECK_VALUE naming each bad value).
  explicit DynamicLossScaler(LossScalerOptions options = {});

  /// Multiplies the loss before backward.
  double scale() const { return scale_; }
  bool dynamic() const { return options_.loss_scale() == 0.0; }
  /// Steps skipped so far (every non-finite one).
  int64_t skipped_steps() const { return skipped_; }

  /// After optimizer step `step` (1-based, for the error) found its
  /// gradients finite or not: adapts the scale and returns true when the
  /// step must be skipped. Throws when a dynamic scale overflows at
  /// min_loss_scale.
  bool update(bool overflow, int64_t step);

  /// Everything update() changes, as one line of text (checkpoints).
  std::string state_dict() const;
  /// Puts back a state_dict(); `where` names its origin in errors. This
  /// run's options win where they bound the state: a static scale stays
  /// this run's, a dynamic one is raised to min_loss_scale, the hysteresis
  /// left is capped at `hysteresis`. Returns what it changed ("" if nothing).
  std::string load_state_dict(const std::string& text, const std::string& where);

  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t iteration_ = 0;           ///< updates so far
  int64_t last_overflow_ = -1;      ///< iteration of the last overflow
  int64_t hysteresis_left_;         ///< overflows still tolerated before halving
  int64_t skipped_ = 0;
};

}  // namespace strata
