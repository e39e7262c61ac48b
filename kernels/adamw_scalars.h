#pragma once
// The per-step constants of torch::optim::AdamW's update, already rounded to
// fp32 the way LibTorch 1.13's tensor ops round their Scalar arguments. Plain
// data with no LibTorch types, so the ISA-specific kernel files include
// nothing but ATen's vector headers (see fused_adamw_kernel.h).
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace strata {

struct AdamWScalars {
  float decay;           ///< 1 - lr * weight_decay        (p.mul_)
  float beta1;           ///< exp_avg.mul_(beta1)
  float one_minus_beta1; ///< .add_(grad, 1 - beta1)
  float beta2;           ///< exp_avg_sq.mul_(beta2)
  float one_minus_beta2; ///< .addcmul_(grad, grad, 1 - beta2)
  float sqrt_bias_correction2;  ///< exp_avg_sq.sqrt() / sqrt(1 - beta2^step)
  float eps;             ///< .add_(eps)
  float neg_step_size;   ///< p.addcdiv_(exp_avg, denom, -lr / (1 - beta1^step))
};

/// The kernel over n contiguous elements on the calling thread. `param_bf16`
/// may be null; else it receives bf16(p) after the update (round to nearest
/// even, as Tensor::to(kBFloat16)). One per instruction set.
using AdamWKernelFn = void (*)(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                               float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n);

void adamw_kernel_default(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                          float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n);
/// Only when built for x86-64 (STRATA_KERNELS_AVX2); call only where the CPU has AVX2 and FMA.
void adamw_kernel_avx2(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n);

}  // namespace strata
