#include "strata/recipes/models/lm.h"

namespace strata::recipes {

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), target.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
}

ValidationStep lm_validation(const torch::Tensor& logits_any, const Batch& batch) {
  auto logits = logits_any.to(torch::kFloat32);
  auto loss_sum = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), batch.target.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
  auto scored = batch.target.ne(-1);
  auto right = logits.argmax(-1).eq(batch.target).logical_or(scored.logical_not());
  ValidationStep out;
  out.loss_sum = loss_sum.item<double>();
  out.tokens = scored.sum().item<int64_t>();
  out.correct_samples = right.all(/*dim=*/1).sum().item<int64_t>();
  out.samples = batch.input.size(0);
  return out;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& target, const tp::Parallel& tp, int64_t vocab) {
  return tp.on() ? tp::vocab_parallel_cross_entropy(logits, target, tp, vocab) : lm_loss(logits, target);
}

ValidationStep lm_validation(const torch::Tensor& logits, const Batch& batch, const tp::Parallel& tp, int64_t vocab) {
  return tp.on() ? tp::vocab_parallel_validation(logits, batch, tp, vocab) : lm_validation(logits, batch);
}

}  // namespace strata::recipes
