#pragma once
// The tiled causal attention's products in bf16 (AVX512-BF16's VDPBF16PS:
// pairs of bf16 products summed into fp32 lanes, twice fp32 FMA's rate) for
// bf16 q, k, v: the path kernels/attention.cpp takes for them on CPUs that
// have the instructions. The softmax, its statistics, dropout and every
// accumulator stay fp32, as in the fp32 tiles; what is rounded to bf16 is
// each product's input: q, k, v themselves (already bf16), the probabilities
// P before P·V, dO, and the score gradients dS before dS·K and dSᵀ·q
// (flash-attention's practice on GPUs).
//
// Internal to kernels/: attention.cpp calls it; the layout helpers it shares
// with the fp32 tiles are in attention_steps.h.
#include "strata/kernels/attention_steps.h"

#include <torch/torch.h>

namespace strata::kernels::bf16 {

/// True when this CPU has avx512_bf16 and the environment does not set
/// STRATA_ATTENTION_BF16=0 (which keeps bf16 inputs on the fp32 tiles, e.g.
/// to compare the two).
bool available();

/// The forward of every head of bf16 q, k, v ([B, H, T, D], D contiguous):
/// writes `out` (fp32, [B, H, T, D] in [B, T, H, D] memory) and `lse`
/// (fp32 [B, H, T]).
void forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const tiles::TileShape& ts,
             torch::Tensor& out, torch::Tensor& lse);

/// The backward of every head: dq, dk, dv (fp32, as `out` above) from bf16
/// q, k, v, grad_out and out (fp32 or bf16, D contiguous) and lse (fp32,
/// contiguous).
void backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& grad_out,
              const torch::Tensor& out, const torch::Tensor& lse, const tiles::TileShape& ts, torch::Tensor& dq,
              torch::Tensor& dk, torch::Tensor& dv);

}  // namespace strata::kernels::bf16
