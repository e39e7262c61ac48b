#pragma once
// PipelineParallel: the pipeline dimension beside a strategy (issue 47). As a
// ModelParallel it tells the strategy what the other stages' ranks hold (the
// global gradient norm, checkpoints' pieces); as its StepRunner it runs each
// step's micro-batches through the schedule (executor.h) and validation
// through the stages, and sums tied weights' gradients between the first
// and the last stage.
//
// Example (strata-gpt's pipeline_run.cpp):
//   auto pipeline = std::make_shared<pp::PipelineParallel>(world, pp_group, stage_module,
//                                                          pp::PipelineOptions().schedule("1f1b"));
//   strategy->set_model_parallel(pipeline);
//   strategy->set_step_runner(pipeline);
#include "strata/strategies/pp/executor.h"
#include "strata/strategies/pp/stage_module.h"
#include "strata/strategies/strategy.h"

#include <map>
#include <memory>
#include <string>

namespace strata::pp {

struct PipelineOptions {
  /// make_schedule's name: gpipe, 1f1b, interleaved-1f1b, zero-bubble (or an alias).
  TORCH_ARG(std::string, schedule) = "1f1b";
  /// Stages per rank (interleaved-1f1b: > 1).
  TORCH_ARG(int, virtual_stages) = 1;
};

class PipelineParallel : public ModelParallel, public StepRunner {
 public:
  /// `world`: every rank of the job; `group`: this rank's pipeline, its
  /// ranks in stage order (stage s on group rank s mod size); `module`: this
  /// rank's stages (kept by reference: it outlives this). Collective over
  /// `group`: it splits the message lanes (executor.h's PipelineLanes).
  PipelineParallel(Comm world, Comm group, StageModule& module, PipelineOptions options);

  // ModelParallel
  const Comm& world() const override { return world_; }
  bool counts_gradient(const std::string& name) const override;
  void sum_over_group(torch::Tensor& sq) override;
  std::shared_ptr<void> gather_full_params(TrainingModule& module, bool writeback) override;
  std::vector<StatePiece> to_global(std::vector<StatePiece> pieces, StateUse use) const override;

  // StepRunner
  std::vector<double> forward_backward(Strategy& strategy, TrainingModule& module, const std::vector<Batch>& batches,
                                       const StepContext& context, MicroBatchTimes& times) override;
  void after_gradient_sync(Strategy& strategy) override;
  ValidationStep validation_step(Strategy& strategy, TrainingModule& module, const Batch& batch) override;

  /// Collective over the group: on its rank 0, every parameter of the whole
  /// model (the whole module's names, in its order; each from the rank
  /// holding it, on the CPU); empty on the others.
  std::vector<std::pair<std::string, torch::Tensor>> gather_parameters();

  /// This rank's split of the last step's schedule (its bubble: idle_share()).
  const StepSeconds& last_step() const { return last_step_; }
  const PipelineOptions& options() const { return options_; }

  /// "pipeline: 2 stages ..." for the run's header.
  std::string describe() const;
  const Comm& group() const { return group_; }

 private:
  const Schedule& schedule_for(int microbatches);
  bool holds_first() const { return module_.held().count(0) != 0; }
  int last_stage() const { return static_cast<int>(module_.cuts().size()) - 1; }
  int last_rank() const { return last_stage() % group_.size(); }
  /// Group rank `root`'s `values` on every rank of the group.
  std::vector<double> share(std::vector<double> values, int root);

  Comm world_;
  Comm group_;
  PipelineLanes lanes_;  ///< group_'s ranks, one communicator per message lane (executor.h)
  StageModule& module_;
  PipelineOptions options_;
  std::vector<std::string> tied_;  ///< the model's tied parameters (asked per gradient by the norm)
  std::unique_ptr<Schedule> schedule_;  ///< for the last micro-batch count seen
  StepSeconds last_step_;
};

}  // namespace strata::pp
