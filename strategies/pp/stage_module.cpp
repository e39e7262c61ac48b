// StageModule and stage_cuts (stage_module.h).
#include "strata/strategies/pp/stage_module.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

namespace strata::pp {

std::vector<StageCut> stage_cuts(const PipelineModel& model, int stages, const std::string& split) {
  const int64_t blocks = model.pipeline_blocks();
  std::vector<UnitRange> ranges;
  if (split.empty()) {
    const auto [first, last] = model.end_costs();
    ranges = balanced_split(model.block_costs(), stages, first, last);
  } else {
    ranges = parse_split(split, blocks, stages);
  }
  std::vector<StageCut> cuts;
  for (size_t s = 0; s < ranges.size(); ++s) cuts.push_back({ranges[s], s == 0, s + 1 == ranges.size()});
  return cuts;
}

namespace {

/// Registers `child` at the dotted `path` under `root` ("model.layers.3":
/// empty containers for "model" and "layers" made as needed), so its
/// parameters keep the whole model's names.
void register_at(torch::nn::Module& root, const std::string& path, std::shared_ptr<torch::nn::Module> child) {
  torch::nn::Module* parent = &root;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; start = dot + 1, dot = path.find('.', start)) {
    const std::string part = path.substr(start, dot - start);
    auto children = parent->named_children();
    auto* existing = children.find(part);
    parent = existing != nullptr ? existing->get()
                                 : parent->register_module(part, std::make_shared<torch::nn::Module>(part)).get();
  }
  parent->register_module(path.substr(start), std::move(child));
}

}  // namespace

/// One held stage as the executor runs it.
class StageModule::HeldStage : public Stage {
 public:
  HeldStage(StageModule& owner, int stage, std::vector<torch::Tensor> params)
      : owner_(owner), stage_(stage), params_(std::move(params)) {}
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& target) override {
    auto out = owner_.forward_stage(stage_, input);
    return owner_.held_.at(stage_).last ? owner_.model_->stage_loss(out, target) : out;
  }
  std::vector<torch::Tensor> parameters() override { return params_; }

 private:
  StageModule& owner_;
  int stage_;
  std::vector<torch::Tensor> params_;  ///< trainable, fixed at construction (W asks every micro-batch)
};

StageModule::StageModule(std::unique_ptr<TrainingModule> whole, std::vector<StageCut> cuts, const std::vector<int>& held)
    : whole_(std::move(whole)), cuts_(std::move(cuts)), root_(std::make_shared<torch::nn::Module>("PipelineStages")) {
  for (int s : held) {
    TORCH_CHECK_VALUE(s >= 0 && s < int(cuts_.size()), "pipeline stage ", s, " of ", cuts_.size());
    held_[s] = cuts_[size_t(s)];
  }
  model_ = dynamic_cast<PipelineModel*>(whole_.get());
  tp_model_ = dynamic_cast<tp::TensorParallelModel*>(whole_.get());
  TORCH_CHECK_VALUE(model_ != nullptr, "this model cannot be cut into pipeline stages (its TrainingModule is no "
                    "pp::PipelineModel)");
  TORCH_CHECK_VALUE(!held_.empty(), "a pipeline rank holds at least one stage");
  std::set<std::string> registered;
  const auto all_units = whole_->wrap_units();
  TORCH_CHECK_VALUE(int64_t(all_units.size()) == model_->pipeline_blocks(), "a pipeline model of ",
                    model_->pipeline_blocks(), " blocks has ", all_units.size(), " wrap units");
  for (const auto& [stage, cut] : held_) {
    std::vector<torch::Tensor> params;
    for (const auto& [name, child] : model_->stage_children(cut)) {
      // A child two held stages use (a tied embedding with one rank) once.
      if (registered.insert(name).second) register_at(*root_, name, child);
      for (const auto& p : child->parameters()) {
        if (p.requires_grad()) params.push_back(p);
      }
    }
    for (int64_t b = cut.blocks.first; b < cut.blocks.second; ++b) {
      unit_of_block_[b] = static_cast<int64_t>(units_.size());
      units_.push_back(all_units.at(size_t(b)));
    }
    stages_[stage] = std::make_unique<HeldStage>(*this, stage, std::move(params));
  }
}

StageModule::~StageModule() = default;

torch::Tensor StageModule::training_step(const Batch&) {
  TORCH_CHECK(false, "a pipeline stage's micro-batches run through its schedule (PipelineParallel), not "
              "training_step");
}

ValidationStep StageModule::validation_step(const Batch&) {
  TORCH_CHECK(false, "a pipeline stage validates through its schedule (PipelineParallel), not validation_step");
}

tp::Plan StageModule::tensor_parallel_plan() const {
  tp::Plan held;
  if (tp_model_ == nullptr) return held;
  const auto names = root_->named_parameters(/*recurse=*/true).keys();
  for (const auto& rule : tp_model_->tensor_parallel_plan()) {
    if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return tp::rule_matches(rule, n); })) {
      held.push_back(rule);
    }
  }
  return held;
}

std::string StageModule::tensor_parallel_problem(int size, bool sequence_parallel) const {
  if (tp_model_ == nullptr) return "this model's stages cannot split over tensor-parallel ranks (its TrainingModule "
                                   "is no tp::TensorParallelModel)";
  return tp_model_->tensor_parallel_problem(size, sequence_parallel);
}

void StageModule::set_tensor_parallel(const tp::Parallel& parallel) {
  TORCH_CHECK(tp_model_ != nullptr, "set_tensor_parallel on stages of a model without a tensor-parallel plan");
  tp_model_->set_tensor_parallel(parallel);
}

std::map<int, Stage*> StageModule::stages() {
  std::map<int, Stage*> out;
  for (auto& [s, stage] : stages_) out[s] = stage.get();
  return out;
}

torch::Tensor StageModule::forward_stage(int stage, const torch::Tensor& x) {
  return model_->stage_forward(held_.at(stage), x,
                               [this](int64_t block, const torch::Tensor& in, const UnitFn& forward) {
                                 return run_unit(unit_of_block_.at(block), in, forward);
                               });
}

}  // namespace strata::pp
