#pragma once
// EarlyStopping: ends fit() when the monitored validation metric stops
// improving, or when the training loss is no longer finite.
//
// As in Lightning: a validation improves when it beats the best so far by
// more than min_delta (below it in mode kMin, above it in kMax); after
// `patience` validations in a row without improvement, trainer.request_stop()
// is called with the reason. With check_finite, a NaN/inf training loss
// (on_train_batch_end) or monitored value stops at once.
//
// Metrics handed to callbacks are already reduced over ranks, so every rank
// makes the same decision and the ranks stop together.
//
// Example:
//   std::make_shared<strata::EarlyStopping>(strata::EarlyStoppingOptions().patience(5).min_delta(1e-3));
#include "strata/callbacks/monitor_mode.h"
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

namespace strata {

struct EarlyStoppingOptions {
  /// "val_loss" or "val_accuracy".
  TORCH_ARG(std::string, monitor) = "val_loss";
  TORCH_ARG(MonitorMode, mode) = MonitorMode::kMin;
  /// Validations without improvement before stopping.
  TORCH_ARG(int64_t, patience) = 3;
  /// Smallest change that counts as an improvement.
  TORCH_ARG(double, min_delta) = 0.0;
  /// Stop on a NaN/inf training loss or monitored value.
  TORCH_ARG(bool, check_finite) = true;
};

class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options = {});

  std::string name() const override { return "EarlyStopping"; }

  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  void on_validation_end(Trainer& trainer, TrainingModule& module,
                         const ValidationMetrics& metrics) override;
  /// best and wait count (a resumed fit continues the patience count).
  std::string state_dict() const override;
  void load_state_dict(const std::string& state) override;

  /// Best monitored value so far (empty before the first validation).
  std::optional<double> best() const { return best_; }
  /// Validations since the last improvement.
  int64_t wait_count() const { return wait_; }
  bool stopped() const { return !reason_.empty(); }
  /// Why it stopped ("" if it did not).
  const std::string& reason() const { return reason_; }

 private:
  void stop(Trainer& trainer, std::string reason);

  EarlyStoppingOptions options_;
  std::optional<double> best_;
  int64_t wait_ = 0;
  std::string reason_;
};

}  // namespace strata
