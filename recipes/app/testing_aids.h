#pragma once
// Fault injection for strata's own tests (listed by --help-all, not --help).
#include "strata/strategies/comm.h"
#include "strata/trainer/callback.h"

#include <cstdint>
#include <string>

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

/// STRATA_TEST_KILL_AT_STEP=S and STRATA_TEST_KILL_RANK=R make rank R
/// SIGKILL itself at the start of step S, as the OOM killer or a lost node
/// would end it (no error file, no cleanup). With STRATA_TEST_KILL_ONCE=FILE
/// only while FILE does not exist, which it creates first: the restarted job
/// (torchrun --max-restarts, a requeue, by hand) runs on (the restart tests).
class KillAtStep : public Callback {
 public:
  KillAtStep(int64_t step, int rank, std::string once_file)
      : step_(step), rank_(rank), once_file_(std::move(once_file)) {}
  std::string name() const override { return "KillAtStep"; }
  void on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) override;

 private:
  int64_t step_;
  int rank_;
  std::string once_file_;
};

/// STRATA_TEST_SKIP_COLLECTIVE=N and STRATA_TEST_SKIP_RANK=R (default 0):
/// rank R does not issue its N-th collective of the world
/// (Comm::skip_collective_for_testing), as a rank with a control-flow bug
/// would; the flight recorder names the mismatch. Nothing when unset.
void apply_skip_collective_aid(Comm& comm);

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
