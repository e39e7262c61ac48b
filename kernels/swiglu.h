#pragma once
// SwiGLU's elementwise half, silu(gate) · up (the Llama family's MLP), as one
// fused CPU op, forward and backward. Autograd's composite keeps silu(gate)
// beside both inputs for the product's backward: one more tensor of the MLP's
// width per block. This keeps only gate and up, recomputes the sigmoid in
// backward, and makes one pass over memory each way.
//
// fp32, bf16 or fp16 (computed in fp32, each output rounded once); gate and up
// of one shape and dtype. On other devices the ATen composite runs.
//
// Example:
//   auto mid = strata::kernels::swiglu(gate_proj(x), up_proj(x));
#include <torch/torch.h>

namespace strata::kernels {

/// silu(gate) · up, differentiable (a torch::autograd::Function saving gate
/// and up).
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

/// The kernels themselves (no autograd), CPU only: out = silu(g) · u, and
/// from dy: dg = dy · u · s · (1 + g · (1 - s)), du = dy · g · s with
/// s = sigmoid(g).
torch::Tensor swiglu_forward(const torch::Tensor& gate, const torch::Tensor& up);
std::pair<torch::Tensor, torch::Tensor> swiglu_backward(const torch::Tensor& grad_out, const torch::Tensor& gate,
                                                        const torch::Tensor& up);

}  // namespace strata::kernels
