#pragma once
// Linear warmup then cosine decay to min_lr (nanoGPT's get_lr).
#include <torch/arg.h>

#include <cstdint>

namespace strata {

struct LrScheduleOptions {
  explicit LrScheduleOptions(double lr) : lr_(lr) {}
  /// Peak learning rate.
  TORCH_ARG(double, lr);
  /// Steps of linear warmup from 0 (step 0 gets lr/(warmup+1)).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Step at which the cosine reaches min_lr; constant afterwards.
  TORCH_ARG(int64_t, decay_steps) = 1;
  /// Floor of the schedule; also the value after decay_steps.
  TORCH_ARG(double, min_lr) = 0.0;
};

class WarmupCosineSchedule {
 public:
  explicit WarmupCosineSchedule(LrScheduleOptions options);
  /// Learning rate for (0-based) optimizer step `step`.
  double operator()(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace strata
