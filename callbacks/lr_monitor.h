#pragma once
// LrMonitor: logs the optimizer's learning rate every step (Lightning's
// LearningRateMonitor with logging_interval="step").
//
// "lr" is the first parameter group's rate; when the groups' rates differ,
// "lr-group<i>" is logged for every group i as well. Keys carry an optional
// prefix ("train/" -> "train/lr").
//
// Example:
//   std::make_shared<strata::LrMonitor>(strata::LrMonitorOptions().prefix("opt/"))
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <string>

namespace strata {

struct LrMonitorOptions {
  /// Prepended to every key.
  TORCH_ARG(std::string, prefix) = "";
};

class LrMonitor : public Callback {
 public:
  explicit LrMonitor(LrMonitorOptions options = {});

  std::string name() const override { return "LrMonitor"; }

  /// Logs nothing while the trainer has no optimizer.
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;

 private:
  LrMonitorOptions options_;
};

/// The values LrMonitor logs for `optimizer`: "<prefix>lr", plus
/// "<prefix>lr-group<i>" per group when the groups' rates differ. Empty when
/// the optimizer has no parameter group.
LogRow learning_rates(const torch::optim::Optimizer& optimizer, const std::string& prefix = "");

}  // namespace strata
