#pragma once
// Fault injection for strata's own tests (listed by --help-all, not --help).
#include "strata/trainer/callback.h"

#include <cstdint>

namespace strata::recipes {

/// STRATA_TEST_FAIL_AT_STEP=S and STRATA_TEST_FAIL_RANK=R make rank R throw at
/// the start of step S (the failure-handling tests).
class FailAtStep : public Callback {
 public:
  FailAtStep(int64_t step, int rank) : step_(step), rank_(rank) {}
  std::string name() const override { return "FailAtStep"; }
  void on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) override;

 private:
  int64_t step_;
  int rank_;
};

/// --debug-overflow-step S: at step S the last rank's loss gradient is
/// multiplied by 1e6 on its way back (a hook on the loss), as a batch whose
/// loss blows up would: under 16-mixed its fp16 gradients overflow, and after
/// the reduction every rank must skip the step.
class OverflowAtStep : public Callback {
 public:
  explicit OverflowAtStep(int64_t step) : step_(step) {}
  std::string name() const override { return "OverflowAtStep"; }
  void on_before_backward(Trainer& trainer, TrainingModule&, const torch::Tensor& loss) override;

 private:
  int64_t step_;
};

}  // namespace strata::recipes
