// The AdamW kernel for any CPU (ATen's portable vector type; see
// fused_adamw_kernel.h).
#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY DEFAULT
#endif
#include "strata/kernels/fused_adamw_kernel.h"

namespace strata {

void adamw_kernel_default(const AdamWScalars& s, float* param, const float* grad, float* exp_avg,
                          float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n) {
  adamw_kernel_impl(s, param, grad, exp_avg, exp_avg_sq, param_bf16, n);
}

}  // namespace strata
