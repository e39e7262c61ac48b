#pragma once
// ProgressBar: what the user sees while fit() runs (rank 0 only).
//
// On a terminal it draws one live line, redrawn in place with '\r' at most
// refresh_hz times a second:
//   step  100/1500 [==>                 ]   6% | loss 1.2345 | lr 3.00e-03 | 12345 tok/s | eta 2m05s
// Otherwise (a pipe, a log file, a test) it prints one plain line per on_log
// (val_* values excepted: they have their own line):
//   step 100/1500 | loss 1.2345 | lr 3.00e-03 | 12345 tok/s | grad_norm 0.532 | eta 2m05s
// and one line per validation:
//   validation step 100 | val_loss 1.2345 | val_accuracy 0.9800
//
// Example:
//   std::ostringstream out;
//   auto bar = std::make_shared<strata::ProgressBar>(
//       strata::ProgressBarOptions().mode(strata::ProgressMode::kPlain), out);
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <ostream>
#include <string>

namespace strata {

enum class ProgressMode {
  kAuto,   ///< live bar when writing to std::cout and stdout is a TTY, else plain
  kPlain,  ///< always plain lines
  kLive,   ///< always the live '\r' bar
};

struct ProgressBarOptions {
  TORCH_ARG(ProgressMode, mode) = ProgressMode::kAuto;
  /// Most redraws per second of the live bar.
  TORCH_ARG(double, refresh_hz) = 10.0;
  /// Characters between the brackets of the live bar.
  TORCH_ARG(int64_t, bar_width) = 20;
};

class ProgressBar : public Callback {
 public:
  /// `out` must outlive the callback.
  explicit ProgressBar(ProgressBarOptions options = {}, std::ostream& out = std::cout);

  std::string name() const override { return "ProgressBar"; }

  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  void on_validation_end(Trainer& trainer, TrainingModule& module,
                         const ValidationMetrics& metrics) override;
  void on_log(Trainer& trainer, int64_t step, const LogRow& row) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;
  void on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) override;

  /// True when this bar draws the live line (resolved from the mode).
  bool live() const { return live_; }

 private:
  void draw_live(int64_t step, bool force);
  void end_live_line();
  /// Mean tokens/s over the steps seen, the first (warm-up) step excluded.
  double tokens_per_s() const;
  std::string eta(int64_t step) const;

  ProgressBarOptions options_;
  std::ostream* out_;
  bool live_ = false;
  int64_t max_steps_ = 0;
  // Running state from on_train_batch_end.
  double loss_ = 0.0;
  double lr_ = 0.0;
  int64_t steps_seen_ = 0;
  int64_t timed_tokens_ = 0;
  double timed_seconds_ = 0.0;
  double last_step_seconds_ = 0.0;
  // Live bar bookkeeping.
  std::chrono::steady_clock::time_point last_draw_{};
  size_t last_width_ = 0;
  bool line_open_ = false;
};

}  // namespace strata
