#pragma once
// MemoryMonitor: per-step memory of this rank, and its model-state bytes.
//
// Logs with trainer.log() in on_train_batch_end:
//   mem_current_mib, mem_peak_mib  live / peak tensor bytes from the Trainer's
//                                  MemoryTracker (only when it has one)
//   rss_peak_mib                   peak resident set size of the process (VmHWM)
// Logged values are this rank's (the log row is rank 0's). At fit end it reads
// strategy().model_state_bytes(optimizer): params / grads / optimizer state
// this rank holds, the numbers DESIGN.md's ZeRO formulas predict. Gradients
// are gone by then (zero_grad sets them to none), so their bytes are the
// largest seen in on_before_optimizer_step.
//
// Example:
//   auto mem = std::make_shared<strata::MemoryMonitor>();
//   ... trainer.fit(module, data);
//   std::cout << mem->summary() << "\n";
#include "strata/trainer/callback.h"
#include "strata/strategies/strategy.h"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

namespace strata {

class MemoryTracker;

struct MemoryMonitorOptions {
  /// Log mem_current_mib / mem_peak_mib (when the Trainer has a MemoryTracker).
  TORCH_ARG(bool, log_tensor_memory) = true;
  /// Log rss_peak_mib.
  TORCH_ARG(bool, log_rss) = true;
};

class MemoryMonitor : public Callback {
 public:
  explicit MemoryMonitor(MemoryMonitorOptions options = {});

  std::string name() const override { return "MemoryMonitor"; }

  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  void on_before_optimizer_step(Trainer& trainer, TrainingModule& module,
                                torch::optim::Optimizer& optimizer) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;

  /// Reads the counters (what on_train_batch_end does) and returns the values
  /// to log. `memory` may be null.
  LogRow sample(const MemoryTracker* memory);

  /// Highest tensor peak seen by sample(), bytes (0 without a tracker).
  int64_t peak_tensor_bytes() const { return peak_tensor_bytes_; }
  /// Highest peak RSS seen by sample(), bytes.
  int64_t peak_rss_bytes() const { return peak_rss_bytes_; }
  /// This rank's model state at fit end; empty before, or without an optimizer.
  const std::optional<ModelStateBytes>& model_state() const { return model_state_; }
  /// "model state: params 1.2 MiB + grads 1.2 MiB + optimizer 2.4 MiB = 4.8 MiB;
  /// peak tensors 9.9 MiB; peak RSS 300.0 MiB"
  std::string summary() const;

 private:
  MemoryMonitorOptions options_;
  int64_t peak_tensor_bytes_ = 0;
  int64_t peak_rss_bytes_ = 0;
  int64_t grad_bytes_ = 0;  ///< largest seen before an optimizer step
  std::optional<ModelStateBytes> model_state_;
};

}  // namespace strata
