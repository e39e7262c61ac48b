#pragma once
// What the training loop measures: per-step and validation metrics and the
// rows loggers write. Produced by the Trainer, read by callbacks and
// recipes; in core so that neither has to include the other.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata {

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
  /// The split of step_seconds into disjoint parts (their sum is at most
  /// step_seconds; the rest is data loading, callbacks and bookkeeping).
  /// comm_wait: time blocked waiting for collectives anywhere in the step
  /// (Comm::wait_seconds: all-gathers in forward, bucket waits in backward,
  /// reduce_gradients, the norm and the loss all-reduce, OSS's parameter
  /// broadcast). forward: Strategy::training_step, backward_compute:
  /// Strategy::backward, optimizer: clip_grad_norm + optimizer_step +
  /// zero_grad, each without the comm wait inside it.
  double forward_seconds = 0.0;
  double backward_compute_seconds = 0.0;
  double comm_wait_seconds = 0.0;
  double optimizer_seconds = 0.0;
  /// fp16 loss scaling (--precision 16-mixed): the scale this step's loss was
  /// multiplied by, and whether its gradients overflowed and the optimizer
  /// step was skipped (on every rank). Unset / false otherwise.
  std::optional<double> loss_scale;
  bool skipped = false;
};

struct ValidationMetrics {
  int64_t step = 0;
  double loss = 0.0;
  std::optional<double> accuracy;  ///< exact match, when the data defines it
  int64_t samples = 0;
  int64_t tokens = 0;  ///< scored positions
};

/// An ordered row of named values, as loggers write them.
using LogRow = std::vector<std::pair<std::string, double>>;

}  // namespace strata
