// The GPT's KV-cached forward for generation (gpt.h): the prompt's keys and
// values kept per block, then each new token attends over them, so a token
// costs one position's work instead of the whole sequence's.
#include "strata/recipes/models/gpt/gpt.h"

namespace strata::recipes {

torch::Tensor CausalSelfAttentionImpl::forward_cached(const torch::Tensor& x, torch::Tensor& k_cache,
                                                      torch::Tensor& v_cache) {
  const auto [q, k, v] = heads(x);
  const bool prompt = !k_cache.defined();
  k_cache = prompt ? k : torch::cat({k_cache, k}, /*dim=*/2);
  v_cache = prompt ? v : torch::cat({v_cache, v}, /*dim=*/2);
  // The prompt attends causally within itself; a new token (one query, the
  // last position) attends to every position so far, so no mask.
  return project(at::scaled_dot_product_attention(q, k_cache, v_cache, /*attn_mask=*/{}, 0.0, /*is_causal=*/prompt));
}

torch::Tensor BlockImpl::forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v) {
  const auto h = x + attn_->forward_cached(ln_1_(x), k, v);
  return h + mlp(ln_2_(h));
}

torch::Tensor GPTImpl::forward_cached(const torch::Tensor& idx, GPTKVCache& cache) {
  TORCH_CHECK(!tp_.on(), "generation runs without tensor parallelism");
  TORCH_CHECK(!is_training(), "a cached forward runs in eval mode (no dropout)");
  const int64_t T = idx.size(1), start = cache.length;
  TORCH_CHECK_VALUE(start == 0 || T == 1, "a cached forward takes the prompt first, then one token at a time");
  // Learned positions: the model has block_size of them and no more.
  TORCH_CHECK_VALUE(start + T <= options_.block_size(), "position ", start + T, " exceeds the model's context of ",
                    options_.block_size(), " tokens (its learned positions)");
  if (cache.k.empty()) {
    cache.k.resize(blocks_.size());
    cache.v.resize(blocks_.size());
  }
  auto x = wte_(idx) + wpe_(torch::arange(start, start + T, idx.options()));
  for (size_t i = 0; i < blocks_.size(); ++i) x = blocks_[i]->forward_cached(x, cache.k[i], cache.v[i]);
  cache.length += T;
  x = ln_f_(x);
  return lm_head_ ? lm_head_(x) : torch::matmul(x, wte_->weight.t());
}

}  // namespace strata::recipes
