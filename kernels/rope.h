#pragma once
// Rotary position embeddings in transformers' rotate_half layout,
// x · cos + rotate_half(x) · sin with rotate_half(x) = (-x[D/2:], x[:D/2]),
// as one fused CPU op, forward and backward. The composite makes the rotated
// copy with a cat and runs four passes each way; this is one pass each way
// and keeps only cos and sin for backward (as the composite does).
//
// x [B, H, T, D] of any strides with D contiguous (a transposed [B, T, H, D]
// projection), fp32, bf16 or fp16; cos and sin [T, D] fp32 (computed in fp32,
// rounded once to x's dtype); the output in x's layout and dtype. On other
// devices the composite runs.
//
// Example:
//   auto q_rotated = strata::kernels::rope(q, cos, sin);
#include <torch/torch.h>

namespace strata::kernels {

/// Differentiable in x (cos and sin are constants).
torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

/// The kernel itself (no autograd), CPU only; `inverse` applies the
/// transposed rotation (the backward: dx from dy).
torch::Tensor rope_apply(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool inverse);

}  // namespace strata::kernels
