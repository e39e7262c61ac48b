#pragma once
// The GPT cut into pipeline stages (strategies/pp, docs/pipeline.md): a stage
// runs blocks [from, to); the first also the embeddings, the last the final
// norm, the head and the loss. With tied embeddings (GPT-2's) the first and
// the last stage both use wte: each rank's gradient of it is half the story,
// and pp::exchange_tied_gradient sums the two after the step.
//
// Example (pp 2 over a 4-block GPT, this rank's stage):
//   auto ranges = strata::pp::balanced_split(std::vector<double>(4, 1.0), 2);
//   strata::recipes::GPTStage stage(model, ranges[rank], rank == 0, rank == 1);
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/pp/executor.h"
#include "strata/strategies/pp/split.h"

namespace strata::recipes {

class GPTStage : public pp::Stage {
 public:
  GPTStage(GPT model, pp::UnitRange blocks, bool first, bool last);
  /// First stage: `input` is token ids [B, T]; last: returns the loss of `target`.
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& target) override;
  std::vector<torch::Tensor> parameters() override;
  /// The parameters' names in the GPT (named_parameters()'s keys), in parameters()' order.
  const std::vector<std::string>& parameter_names() const { return names_; }

 private:
  GPT model_;
  pp::UnitRange blocks_;
  bool first_, last_;
  std::vector<std::string> names_;  ///< fixed at construction: W asks for the parameters every micro-batch
};

}  // namespace strata::recipes
