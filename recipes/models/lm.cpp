#include "strata/recipes/models/lm.h"

#include "strata/kernels/attention.h"
#include "strata/strategies/activation_checkpoint.h"

#include <ATen/autocast_mode.h>

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

/// strata's fused CPU attention, kept for the recompute by a selective
/// activation-checkpointing policy (its output, fp32 output and logsumexp).
torch::Tensor fused_attention(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                              double dropout_p, bool training) {
  // The kernel takes one dtype, as autocast gives ATen's SDPA: under bf16
  // autocast q and k may leave a norm in its weight's fp32 (Llama's q/k norms)
  // while v leaves its projection in bf16.
  const auto dtype =
      at::autocast::is_autocast_enabled(at::kCPU) ? at::autocast::get_autocast_dtype(at::kCPU) : v_in.scalar_type();
  const auto q = q_in.to(dtype), k = k_in.to(dtype), v = v_in.to(dtype);
  const double p = training ? dropout_p : 0.0;
  CheckpointedOp op;
  op.kind = KeptOp::attention;
  op.run = [&] { return kernels::causal_attention(q, k, v, dropout_p, training); };
  op.save = [&] {
    // The seed as causal_attention draws it, kept as a 0-dim tensor.
    const uint64_t seed = p > 0.0 ? kernels::draw_dropout_seed() : 0;
    auto f = kernels::causal_attention_forward(q, k, v, p, seed);
    return std::vector<torch::Tensor>{f.out, f.lse, f.out_fp32,
                                      torch::scalar_tensor(static_cast<int64_t>(seed), torch::kInt64)};
  };
  op.replay = [&](std::vector<torch::Tensor> kept) {
    // Why draw: the forward drew a seed here, and the ops after this one
    // (residual dropout) must draw what they drew in the forward.
    if (p > 0.0) kernels::draw_dropout_seed();
    return kernels::causal_attention_from(q, k, v, {kept[0], kept[1], kept[2]}, p,
                                          static_cast<uint64_t>(kept[3].item<int64_t>()));
  };
  return checkpointed_op(op);
}

}  // namespace strata::recipes
