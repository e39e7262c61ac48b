#pragma once
// Fused causal self-attention for CPU (flash-attention's tiling with an online
// softmax), forward and backward, fp32 and bf16 inputs (fp32 accumulation;
// bf16 inputs multiply in bf16 where the CPU has avx512_bf16, see
// bf16_products_available()).
//
// Shapes: q, k, v are [B, H, T, D] (any strides; D is made contiguous); the
// output has the same shape, laid out as [B, T, H, D] in memory so that the
// caller's transpose(1, 2).contiguous() is free. Grouped-query attention: k
// and v may be [B, Hkv, T, D] with Hkv dividing H, query head h reading kv
// head h / (H / Hkv) (transformers' repeat_kv order) without k and v ever
// being repeated; their gradients sum over each kv head's query heads. The forward keeps only the
// per-row logsumexp [B, H, T] (fp32) besides its inputs and output: activation
// memory is O(B·H·T) instead of the naive path's O(B·H·T²) scores.
//
// Attention dropout: every element's keep decision is a counter-based hash of
// (seed, batch·head, row, column), so the backward regenerates the forward's
// mask from the seed alone, and dropout_keep_mask() materialises the same mask
// for the naive reference. causal_attention() draws the seed from the default
// CPU generator (one 64-bit draw per call): activation checkpointing restores
// that generator's state before recomputing, so the recompute regenerates the
// same mask.
//
// Example:
//   auto y = strata::kernels::causal_attention(q, k, v, /*dropout_p=*/0.1, is_training());
#include <torch/torch.h>

#include <cstdint>

namespace strata::kernels {

struct AttentionForward {
  torch::Tensor out;  ///< [B, H, T, D], q's dtype
  torch::Tensor lse;  ///< [B, H, T] fp32: log of each row's softmax normaliser
  /// `out` before rounding to q's dtype (the same tensor for fp32): what the
  /// backward should get as `out`, since rowsum(dO ∘ O) from a bf16-rounded O
  /// is off by O's rounding error times dO.
  torch::Tensor out_fp32;
};

struct AttentionGrads {
  torch::Tensor dq, dk, dv;  ///< each in its input's shape and dtype
};

/// The kernels themselves (no autograd). Scores are scaled by 1/sqrt(D).
/// dropout_p in [0, 1); with dropout_p == 0 the seed is unused.
AttentionForward causal_attention_forward(const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, double dropout_p,
                                          uint64_t seed);
AttentionGrads causal_attention_backward(const torch::Tensor& grad_out, const torch::Tensor& q,
                                         const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& out, const torch::Tensor& lse,
                                         double dropout_p, uint64_t seed);

/// Differentiable fused attention (a torch::autograd::Function saving q, k, v,
/// the output and the logsumexp). Dropout applies only when `training` and
/// dropout_p > 0; then one seed is drawn from the default CPU generator.
/// CPU tensors only (TORCH_CHECK otherwise).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training);

/// causal_attention's output, with its backward, for a forward already run
/// with `dropout_p` and `seed` (e.g. kept by selective activation
/// checkpointing): no kernel runs. q, k, v must be that forward's inputs
/// (recomputed: the backward reads them). Draws nothing.
torch::Tensor causal_attention_from(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const AttentionForward& forward, double dropout_p, uint64_t seed);

/// True when bf16 q, k, v take the AVX512-BF16 tiles here (bf16 products at
/// twice fp32's rate; P, dO and dS rounded to bf16 before their products):
/// the CPU has avx512_bf16 and STRATA_ATTENTION_BF16 is not "0". Otherwise
/// bf16 inputs are read into the fp32 tiles.
bool bf16_products_available();

/// One 64-bit seed from the default CPU generator (under its mutex: thread
/// ranks share that generator).
uint64_t draw_dropout_seed();

/// The fused kernels' keep decisions as a bool tensor [batch_heads, T, T]
/// (element [bh, i, j]: keep score (i, j) of batch·head bh = b·H + h), for
/// feeding the same mask to the naive path. Entries above the diagonal are
/// computed too but never used.
torch::Tensor dropout_keep_mask(int64_t batch_heads, int64_t T, double dropout_p, uint64_t seed);

/// The unfused reference, step by step: softmax(q kᵀ / sqrt(D), causal) [B, H, T, T].
torch::Tensor naive_causal_probs(const torch::Tensor& q, const torch::Tensor& k);
/// naive_causal_probs(q, k) · v; with `keep` (bool [B, H, T, T] or [B·H, T, T])
/// the probabilities are first multiplied by keep / (1 - dropout_p).
torch::Tensor naive_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& keep = {},
                                     double dropout_p = 0.0);

}  // namespace strata::kernels
