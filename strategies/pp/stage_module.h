#pragma once
// A model cut into pipeline stages, and the TrainingModule of one rank's
// stages (issue 47). A model that can be cut implements PipelineModel: which
// of its child modules a stage holds (its blocks; the embedding on the first
// stage, the final norm and head on the last) and a stage's forward. A rank
// then trains a StageModule: a TrainingModule whose module() holds only its
// stages' children, under the whole model's parameter names, so a strategy
// materialises, syncs and steps only those, and a checkpoint's pieces are
// named as the whole model's (any pp size loads them).
//
// Example (rank r of a 2-stage pipeline over a GPT, strata-gpt's pipeline_run.cpp):
//   auto cuts = strata::pp::stage_cuts(model_as_pipeline, schedule, split);
//   strata::pp::StageModule stages(std::move(module), held_cuts_of_rank_r);
//   strategy->setup(stages);   // only the stages' parameters get memory
#include "strata/core/training_module.h"
#include "strata/strategies/pp/executor.h"
#include "strata/strategies/pp/split.h"
#include "strata/strategies/tp/plan.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace strata::pp {

/// One stage's share: blocks [blocks.first, blocks.second); the first stage
/// also turns token ids into the first activation, the last the last
/// activation into the loss.
struct StageCut {
  UnitRange blocks;
  bool first = false;
  bool last = false;
};

/// Runs block `block` (the whole model's index) on `x`; `forward` is the
/// block's own forward (see TrainingModule's unit seam).
using BlockRunner = std::function<torch::Tensor(int64_t block, const torch::Tensor& x, const UnitFn& forward)>;

/// What a model offers to be cut into stages (implemented by its TrainingModule).
class PipelineModel {
 public:
  virtual ~PipelineModel() = default;
  /// Its blocks, in forward order (the wrap units of the whole model).
  virtual int64_t pipeline_blocks() const = 0;
  /// The child modules of module() that `cut` uses, with their names there:
  /// its blocks, and the embeddings (first) or final norm and head (last).
  /// A module two stages use (a tied embedding) is listed by both.
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> stage_children(
      const StageCut& cut) = 0;
  /// The cut's output for `x` (token ids on the first stage, else the
  /// previous stage's activation): an activation, or on the last stage
  /// what stage_loss() and stage_validation() read (the logits). Each block
  /// runs through `run_block`.
  virtual torch::Tensor stage_forward(const StageCut& cut, const torch::Tensor& x, const BlockRunner& run_block) = 0;
  /// The last stage's loss of its output against `target` (a scalar, the
  /// mean over scored positions), and its validation sums.
  virtual torch::Tensor stage_loss(const torch::Tensor& output, const torch::Tensor& target) = 0;
  virtual ValidationStep stage_validation(const torch::Tensor& output, const Batch& batch) = 0;
  /// The activation between two stages for a micro-batch of token ids `input`.
  virtual std::vector<int64_t> activation_shape(const torch::Tensor& input) const = 0;
  /// Names (in module()) of parameters both the first and the last stage use
  /// (tied embeddings): each stage's rank holds a copy, and the pipeline sums
  /// their gradients.
  virtual std::vector<std::string> tied_parameters() const { return {}; }
  /// Each block's cost and the first and last stage's extras, in any one
  /// unit (parameters, FLOPs), for balanced_split.
  virtual std::vector<double> block_costs() const = 0;
  virtual std::pair<double, double> end_costs() const = 0;
};

/// The stages' cuts: `stages` contiguous block ranges, balanced by
/// `model`'s costs, or `split` ("3,3,2": blocks per stage) when not empty.
std::vector<StageCut> stage_cuts(const PipelineModel& model, int stages, const std::string& split = "");

/// One rank's stages of a model, as a TrainingModule (see the file comment).
/// Its wrap units are the held blocks in forward order, so activation
/// checkpointing and FSDP act on them as on the whole model's. When the whole
/// model splits over tensor-parallel ranks (tp::TensorParallelModel), so do
/// its stages (3D: pp x dp x tp): the whole model's plan, for the held
/// parameters.
class StageModule : public TrainingModule, public tp::TensorParallelModel {
 public:
  /// `whole` must implement PipelineModel; `cuts`: every stage's, in stage
  /// order; `held`: the indices of the stages this rank runs.
  StageModule(std::unique_ptr<TrainingModule> whole, std::vector<StageCut> cuts, const std::vector<int>& held);
  ~StageModule() override;

  torch::nn::Module& module() override { return *root_; }
  /// A stage's micro-batches run through the pipeline's schedule, not here.
  torch::Tensor training_step(const Batch& batch) override;
  ValidationStep validation_step(const Batch& batch) override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override { return units_; }
  double flops_per_token() const override { return whole_->flops_per_token(); }
  void init_parameter(const std::string& name, const torch::Tensor& param) override {
    whole_->init_parameter(name, param);
  }

  // tp::TensorParallelModel: the whole model's, its plan's rules that match
  // a held parameter only (a middle stage holds no embedding to split).
  tp::Plan tensor_parallel_plan() const override;
  std::string tensor_parallel_problem(int size, bool sequence_parallel) const override;
  void set_tensor_parallel(const tp::Parallel& parallel) override;

  /// The executor's stages (stage index -> stage), valid while this lives.
  std::map<int, Stage*> stages();
  const std::map<int, StageCut>& held() const { return held_; }
  /// Every stage's cut, in stage order.
  const std::vector<StageCut>& cuts() const { return cuts_; }
  PipelineModel& model() const { return *model_; }
  TrainingModule& whole() const { return *whole_; }
  /// The last stage's validation sums of one micro-batch's output.
  ValidationStep validate_output(const torch::Tensor& output, const Batch& batch) {
    return model_->stage_validation(output, batch);
  }
  /// Stage `stage`'s forward of `x`, its blocks through this module's runners.
  torch::Tensor forward_stage(int stage, const torch::Tensor& x);

 private:
  class HeldStage;
  std::unique_ptr<TrainingModule> whole_;
  PipelineModel* model_;
  tp::TensorParallelModel* tp_model_;  ///< null: the whole model does not split
  std::vector<StageCut> cuts_;
  std::map<int, StageCut> held_;
  std::shared_ptr<torch::nn::Module> root_;
  std::vector<std::shared_ptr<torch::nn::Module>> units_;
  std::map<int64_t, int64_t> unit_of_block_;  ///< whole-model block -> index in units_
  std::map<int, std::unique_ptr<HeldStage>> stages_;
};

}  // namespace strata::pp
