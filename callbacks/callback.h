#pragma once
// Callback: observes the training loop. Header-only with a forward-declared
// Trainer, so trainer/ can hold callbacks without linking callbacks/.
// Every hook runs on every rank; rank-0-only output checks
// trainer.strategy().is_global_zero().
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

/// What one optimizer step did, averaged over micro-batches and ranks.
struct StepMetrics {
  int64_t step = 0;           ///< optimizer steps done, counting this one (1-based)
  double loss = 0.0;          ///< mean training loss of this step
  double lr = 0.0;
  double grad_norm = 0.0;     ///< global norm before clipping
  int64_t tokens = 0;         ///< tokens processed this step, all ranks
  int64_t samples = 0;        ///< samples processed this step, all ranks
  double step_seconds = 0.0;  ///< wall time of this step
  /// Parts of step_seconds (host wall time: on CUDA, kernels still running
  /// are not included). backward: Strategy::backward over all micro-batches,
  /// hooks and the communication they launch included. grad_sync: the wait in
  /// Strategy::reduce_gradients for communication still outstanding after
  /// backward — the part of it that overlap did not hide.
  double backward_seconds = 0.0;
  double grad_sync_seconds = 0.0;
};

struct ValidationMetrics {
  int64_t step = 0;
  double loss = 0.0;
  std::optional<double> accuracy;  ///< exact match, when the data defines it
  int64_t samples = 0;
};

/// An ordered row of named values, as loggers write them.
using LogRow = std::vector<std::pair<std::string, double>>;

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
  virtual void on_before_optimizer_step(Trainer& trainer, TrainingModule& module,
                                        torch::optim::Optimizer& optimizer) {}
  virtual void on_validation_end(Trainer& trainer, TrainingModule& module,
                                 const ValidationMetrics& metrics) {}
  /// Every log_every_n_steps (and at the last step), after on_train_batch_end,
  /// and after each validation, with everything logged for that step.
  virtual void on_log(Trainer& trainer, int64_t step, const LogRow& row) {}
  /// A checkpoint is being written into / read from `dir`.
  virtual void on_save_checkpoint(Trainer& trainer, const std::string& dir) {}
  virtual void on_load_checkpoint(Trainer& trainer, const std::string& dir) {}
  /// fit() is about to rethrow `error`.
  virtual void on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) {}
};

}  // namespace strata
