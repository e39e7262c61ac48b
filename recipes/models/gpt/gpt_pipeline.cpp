// GPTStage (gpt_pipeline.h): a pipeline stage's share of the GPT.
#include "strata/recipes/models/gpt/gpt_pipeline.h"

#include "strata/recipes/models/lm.h"

#include <c10/util/StringUtil.h>

namespace strata::recipes {

namespace {

/// The names of the parameters a stage of blocks [from, to) uses.
std::vector<std::string> stage_parameter_names(GPT& model, pp::UnitRange blocks, bool first, bool last) {
  std::vector<std::string> prefixes;
  for (int64_t i = blocks.first; i < blocks.second; ++i) prefixes.push_back(c10::str("h", i, "."));
  if (first) prefixes.insert(prefixes.end(), {"wte.", "wpe."});
  // The head is wte itself when tied: then the last stage shares it.
  if (last) prefixes.insert(prefixes.end(), {"ln_f.", "lm_head."});
  if (last && model->options().tie_weights()) prefixes.push_back("wte.");
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) {
    for (const auto& p : prefixes) {
      if (item.key().rfind(p, 0) == 0) {
        names.push_back(item.key());
        break;
      }
    }
  }
  return names;
}

}  // namespace

GPTStage::GPTStage(GPT model, pp::UnitRange blocks, bool first, bool last)
    : model_(std::move(model)), blocks_(blocks), first_(first), last_(last) {
  TORCH_CHECK_VALUE(blocks.first >= 0 && blocks.first < blocks.second &&
                        blocks.second <= int64_t(model_->blocks().size()),
                    "a GPT stage of blocks [", blocks.first, ", ", blocks.second, ") in a model of ",
                    model_->blocks().size());
  TORCH_CHECK(!model_->tensor_parallel().on(), "GPT stages run without tensor parallelism (not yet composed)");
  names_ = stage_parameter_names(model_, blocks_, first_, last_);
}

torch::Tensor GPTStage::forward(const torch::Tensor& input, const torch::Tensor& target) {
  auto x = first_ ? model_->embed(input) : input;
  for (int64_t i = blocks_.first; i < blocks_.second; ++i) x = model_->blocks()[size_t(i)](x);
  if (!last_) return x;
  return lm_loss(model_->head(x), target);
}

std::vector<torch::Tensor> GPTStage::parameters() {
  const auto all = model_->named_parameters();
  std::vector<torch::Tensor> out;
  for (const auto& name : parameter_names()) out.push_back(all[name]);
  return out;
}

}  // namespace strata::recipes
