#pragma once
// Callback: the hooks through which callbacks observe the training loop.
// The interface belongs to the Trainer that calls it (header-only, with a
// forward-declared Trainer); implementations live in callbacks/.
// Every hook runs on every rank; rank-0-only output checks
// trainer.strategy().is_global_zero().
#include "strata/core/metrics.h"

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata {

class Trainer;
class TrainingModule;

class Callback {
 public:
  virtual ~Callback() = default;
  /// Name used in messages and checkpoint files.
  virtual std::string name() const = 0;

  virtual void on_fit_start(Trainer& trainer, TrainingModule& module) {}
  virtual void on_fit_end(Trainer& trainer, TrainingModule& module) {}
  virtual void on_train_batch_start(Trainer& trainer, TrainingModule& module, int64_t step) {}
  /// Callbacks may add values to the step's log row here with trainer.log().
  virtual void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) {}
  virtual void on_before_backward(Trainer& trainer, TrainingModule& module, const torch::Tensor& loss) {}
  virtual void on_after_backward(Trainer& trainer, TrainingModule& module) {}
  /// Gradients are reduced, unscaled and clipped. Not called for a step that
  /// is skipped (16-mixed: non-finite gradients; StepMetrics::skipped).
  virtual void on_before_optimizer_step(Trainer& trainer, TrainingModule& module,
                                        torch::optim::Optimizer& optimizer) {}
  virtual void on_validation_end(Trainer& trainer, TrainingModule& module,
                                 const ValidationMetrics& metrics) {}
  /// The step is complete: its log row and (when due) its validation are
  /// done. A checkpoint written here holds everything about `step`, so a
  /// resume from it continues at step + 1 (ModelCheckpoint saves here).
  virtual void on_train_step_end(Trainer& trainer, TrainingModule& module, int64_t step) {}
  /// Every log_every_n_steps (and at the last step), after on_train_batch_end,
  /// and after each validation, with everything logged for that step.
  virtual void on_log(Trainer& trainer, int64_t step, const LogRow& row) {}
  /// A checkpoint is being written into / read from `dir`.
  virtual void on_save_checkpoint(Trainer& trainer, const std::string& dir) {}
  virtual void on_load_checkpoint(Trainer& trainer, const std::string& dir) {}
  /// State that must survive a resume (e.g. EarlyStopping's best score),
  /// serialised by the callback itself; saved in every checkpoint under
  /// name() (rank 0's: base it on rank-reduced values so every rank agrees)
  /// and handed back to load_state_dict() on a resumed fit, after
  /// on_fit_start() (so a callback may reset itself there). "" = nothing.
  virtual std::string state_dict() const { return {}; }
  virtual void load_state_dict(const std::string& state) {}
  /// fit() is about to rethrow `error`.
  virtual void on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) {}
};

}  // namespace strata
