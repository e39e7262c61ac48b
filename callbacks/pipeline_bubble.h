#pragma once
// PipelineBubble: each pipeline rank's measured bubble (docs/pipeline.md).
// Over a fit's steady steps (all but its first) it sums each rank's split of
// the schedule (pp::StepSeconds: forwards, backwards, waits, the whole), and
// at the end rank 0 of the job writes them to a JSON file with each rank's
// idle share beside what the schedule's simulation (strategies/pp/schedule.h)
// predicts from the measured per-micro-batch costs with free transfers, and
// the closed formula: (P − 1)/(V·M + P − 1) for gpipe, 1f1b and interleaved;
// ZB-H1's (P − 1)(F + I − W) bubble beside M(F + I + W) of work. A fit
// without a steady step writes nothing.
//
// Example:
//   callbacks.push_back(std::make_shared<strata::PipelineBubble>(pipeline, "/tmp/run/pipeline.json"));
#include "strata/strategies/pp/pipeline_parallel.h"
#include "strata/trainer/callback.h"

#include <memory>
#include <string>

namespace strata {

class PipelineBubble : public Callback {
 public:
  PipelineBubble(std::shared_ptr<pp::PipelineParallel> pipeline, std::string path);
  std::string name() const override { return "PipelineBubble"; }
  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;
  /// Collective over the job: gathers every rank's sums; rank 0 writes.
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;

 private:
  std::shared_ptr<pp::PipelineParallel> pipeline_;
  std::string path_;
  pp::StepSeconds sums_;
  int64_t steps_ = 0;
  bool first_ = true;
};

}  // namespace strata
