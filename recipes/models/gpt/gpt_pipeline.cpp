// GPTModule as a pp::PipelineModel (gpt.h): the GPT cut into pipeline stages
// (strategies/pp/stage_module.h, docs/pipeline.md). A stage runs its blocks;
// the first also the embeddings, the last the final norm, the head and the
// loss. With tied embeddings (GPT-2's) the first and the last stage both use
// wte: each rank's gradient of it is half the story, and the pipeline sums
// the two after the step.
#include "strata/recipes/models/gpt/gpt.h"


#include <c10/util/StringUtil.h>

namespace strata::recipes {

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> GPTModule::stage_children(
    const pp::StageCut& cut) {
  TORCH_CHECK_VALUE(cut.blocks.first >= 0 && cut.blocks.first < cut.blocks.second &&
                        cut.blocks.second <= pipeline_blocks(),
                    "a GPT stage of blocks [", cut.blocks.first, ", ", cut.blocks.second, ") in a model of ",
                    pipeline_blocks());
  std::vector<std::string> names;
  if (cut.first) names.insert(names.end(), {"wte", "wpe", "drop"});
  for (int64_t i = cut.blocks.first; i < cut.blocks.second; ++i) names.push_back(c10::str("h", i));
  // The head is wte itself when tied: then the last stage uses it too.
  if (cut.last) names.push_back("ln_f");
  if (cut.last) names.push_back(model_->options().tie_weights() ? "wte" : "lm_head");
  const auto children = model_->named_children();
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& name : names) out.emplace_back(name, children[name]);
  return out;
}

torch::Tensor GPTModule::stage_forward(const pp::StageCut& cut, const torch::Tensor& x, const pp::BlockRunner& run) {
  auto h = cut.first ? model_->embed(x) : x;
  for (int64_t i = cut.blocks.first; i < cut.blocks.second; ++i) {
    // The block by value: a runner may call it again during backward (checkpointing).
    h = run(i, h, [block = model_->blocks()[size_t(i)].ptr()](const torch::Tensor& t) { return block->forward(t); });
  }
  return cut.last ? model_->head(h) : h;
}

std::vector<std::string> GPTModule::tied_parameters() const {
  if (!model_->options().tie_weights()) return {};
  return {"wte.weight"};
}

std::vector<double> GPTModule::block_costs() const {
  int64_t per_block = 0;  // every block is alike: block 0's parameters
  for (const auto& p : model_->named_parameters()) {
    if (p.key().rfind("h0.", 0) == 0) per_block += p.value().numel();
  }
  return std::vector<double>(size_t(pipeline_blocks()), double(per_block));
}

std::pair<double, double> GPTModule::end_costs() const {
  const auto& o = model_->options();
  const double embeddings = double((o.vocab_size() + o.block_size()) * o.n_embd());
  // The head's matmul costs as much as a block's parameters' worth of work
  // per vocabulary row: counted as its matrix, tied or not.
  return {embeddings, double(o.vocab_size() * o.n_embd() + 2 * o.n_embd())};
}

}  // namespace strata::recipes
