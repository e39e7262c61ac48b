#pragma once
// RMSNorm as transformers computes it (LlamaRMSNorm: x in fp32 times
// rsqrt(mean(x²) + eps), cast back to x's dtype, times the weight) as one
// fused CPU op, forward and backward. Autograd's composite keeps the
// normalised x beside x for backward (one more tensor of the norm's input
// size, per norm) and runs six passes over memory forward; this keeps x and
// one fp32 number per row, and makes one pass each way (plus a sum over rows
// for the weight's gradient).
//
// x fp32, bf16 or fp16, any leading shape, the normalised dim last; weight
// [C] of any of those dtypes; the output in their promoted dtype, as
// `weight * normed.to(x.dtype)` gives. On other devices the composite runs.
//
// Example:
//   auto y = strata::kernels::rms_norm(x, weight, 1e-5);
#include <torch/torch.h>

#include <tuple>

namespace strata::kernels {

/// Differentiable (a torch::autograd::Function saving x, weight and the
/// per-row reciprocal RMS).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// The kernels themselves (no autograd), CPU only. Forward: y and rstd
/// [rows] (fp32). Backward: dx and, when `weight_grad`, dweight (else
/// undefined).
std::tuple<torch::Tensor, torch::Tensor> rms_norm_forward(const torch::Tensor& x, const torch::Tensor& weight,
                                                          double eps);
std::tuple<torch::Tensor, torch::Tensor> rms_norm_backward(const torch::Tensor& grad_out, const torch::Tensor& x,
                                                           const torch::Tensor& weight, const torch::Tensor& rstd,
                                                           bool weight_grad);

}  // namespace strata::kernels
