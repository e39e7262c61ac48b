// LlamaModule as a pp::PipelineModel (llama.h): the Llama cut into pipeline
// stages (strategies/pp/stage_module.h, docs/pipeline.md). A stage runs its
// decoder layers; the first also the token embedding, the last the final
// norm, the head and the loss. With tied embeddings (Llama 3.2 1B, Qwen2.5's
// small ones) the first and the last stage both use model.embed_tokens, and
// the pipeline sums their gradients after the step.
#include "strata/recipes/models/llama/llama.h"


#include <c10/util/StringUtil.h>

namespace strata::recipes {

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> LlamaModule::stage_children(
    const pp::StageCut& cut) {
  TORCH_CHECK_VALUE(cut.blocks.first >= 0 && cut.blocks.first < cut.blocks.second &&
                        cut.blocks.second <= pipeline_blocks(),
                    "a Llama stage of layers [", cut.blocks.first, ", ", cut.blocks.second, ") in a model of ",
                    pipeline_blocks());
  const auto modules = model_->named_modules();
  std::vector<std::string> names;
  if (cut.first) names.push_back("model.embed_tokens");
  for (int64_t i = cut.blocks.first; i < cut.blocks.second; ++i) names.push_back(c10::str("model.layers.", i));
  if (cut.last) names.push_back("model.norm");
  if (cut.last) names.push_back(modules.contains("lm_head") ? "lm_head" : "model.embed_tokens");
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
  for (const auto& name : names) out.emplace_back(name, modules[name]);
  return out;
}

torch::Tensor LlamaModule::stage_forward(const pp::StageCut& cut, const torch::Tensor& x, const pp::BlockRunner& run) {
  auto h = cut.first ? model_->embed(x) : x;
  // The positions are the whole sequence's: a later stage's input is this
  // rank's part of it under sequence parallelism.
  const auto& tp = model_->tensor_parallel();
  const int64_t T = cut.first || !tp.sequence_parallel() ? x.size(1) : x.size(1) * tp.size();
  h = model_->run_blocks(h, T, cut.blocks.first, cut.blocks.second, run);
  return cut.last ? model_->head(h) : h;
}

std::vector<std::string> LlamaModule::tied_parameters() const {
  if (model_->named_modules().contains("lm_head")) return {};
  return {"model.embed_tokens.weight"};
}

std::vector<double> LlamaModule::block_costs() const {
  int64_t per_block = 0;  // every layer is alike: layer 0's parameters
  for (const auto& p : model_->named_parameters()) {
    if (p.key().rfind("model.layers.0.", 0) == 0) per_block += p.value().numel();
  }
  return std::vector<double>(size_t(pipeline_blocks()), double(per_block));
}

std::pair<double, double> LlamaModule::end_costs() const {
  const auto& o = model_->options();
  // The embedding's lookup is cheap but its table is memory; the head is a
  // vocabulary-wide matrix either way.
  return {double(o.vocab_size() * o.n_embd()), double(o.vocab_size() * o.n_embd() + o.n_embd())};
}

}  // namespace strata::recipes
