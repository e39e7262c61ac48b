#pragma once
// Profiler: a Chrome trace of a few training steps per rank, through
// LibTorch's Kineto profiler (what torch.profiler writes in Python).
//
// Steps [skip + 1, skip + steps] are recorded (the first steps are warm-up:
// allocator, thread pools, lazy initialisation), then each rank writes
// DIR/trace-rank<R>.json. Every ATen op appears, and strata's own phases
// under RECORD_FUNCTION: strata::all_reduce / all_gather / reduce_scatter /
// broadcast (strategies/comm.cpp), strata::fsdp_gather and
// strata::fsdp_reshard, strata::optimizer_step, strata::offload_read /
// offload_write. Open a trace in https://ui.perfetto.dev or chrome://tracing.
//
// Example (strata-gpt --profile DIR does this):
//   callbacks.push_back(std::make_shared<strata::Profiler>(strata::ProfilerOptions("prof").steps(3)));
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <memory>
#include <string>

namespace strata {

struct ProfilerOptions {
  explicit ProfilerOptions(std::string dir) : dir_(std::move(dir)) {}
  /// Where trace-rank<R>.json go (created when missing).
  TORCH_ARG(std::string, dir);
  /// Warm-up steps not recorded.
  TORCH_ARG(int64_t, skip) = 2;
  /// Steps recorded.
  TORCH_ARG(int64_t, steps) = 3;
};

class Profiler : public Callback {
 public:
  explicit Profiler(ProfilerOptions options);
  ~Profiler() override;

  std::string name() const override { return "Profiler"; }
  void on_train_batch_start(Trainer& trainer, TrainingModule& module, int64_t step) override;
  void on_train_step_end(Trainer& trainer, TrainingModule& module, int64_t step) override;
  /// A run shorter than skip + steps writes what it recorded.
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;
  void on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) override;

  /// The trace file of `rank`.
  std::string trace_path(int rank) const;

 private:
  void stop_and_save(int rank);

  ProfilerOptions options_;
  bool active_ = false;
  bool done_ = false;
};

}  // namespace strata
