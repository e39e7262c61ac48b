#pragma once
// The portable AdamW element loop over at::vec::Vectorized<float>, for
// fused_adamw_default.cpp only, which defines CPU_CAPABILITY=DEFAULT first
// (ATen's vector types then live in at::vec::DEFAULT, apart from any other
// ISA's) and so skips the precompiled header built without it. The AVX2
// kernel (fused_adamw_avx2.cpp) is the same math in intrinsics.
//
// The arithmetic repeats LibTorch 1.13's AdamW::step op by op, with the same
// roundings as its CPU kernels (which use these same vector types):
//   p.mul_(decay)                       p = p * decay
//   exp_avg.mul_(b1).add_(g, 1 - b1)    m = fmadd(g, 1 - b1, m * b1)     (add with alpha is fmadd)
//   exp_avg_sq.mul_(b2)
//             .addcmul_(g, g, 1 - b2)   v = fmadd((1 - b2) * g, g, v * b2)  (as the compiler contracts it)
//   (v.sqrt() / sqrt(bc2)).add_(eps)    d = sqrt(v) / sqrt(bc2) + eps
//   p.addcdiv_(m, d, -step_size)        p = p + (-step_size) * m / d
// Tails use partial vector loads/stores like TensorIterator's, so every
// element takes the same path. ATen's portable fmadd is a * b + c, rounded
// twice (so this kernel is within a few ulp of torch, not bit-equal); the file
// is compiled with -ffp-contract=off so the compiler fuses nothing else.
#include "strata/kernels/adamw_scalars.h"

#include <ATen/cpu/vec/vec.h>

#include <algorithm>

namespace strata {
namespace {

using Vec = at::vec::Vectorized<float>;

struct AdamWVecScalars {
  explicit AdamWVecScalars(const AdamWScalars& s)
      : decay(s.decay),
        beta1(s.beta1),
        one_minus_beta1(s.one_minus_beta1),
        beta2(s.beta2),
        one_minus_beta2(s.one_minus_beta2),
        sqrt_bias_correction2(s.sqrt_bias_correction2),
        eps(s.eps),
        neg_step_size(s.neg_step_size) {}
  Vec decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
};

/// One vector of elements; returns the new parameter values.
inline Vec adamw_vec(const AdamWVecScalars& s, float* param, const float* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t count) {
  const bool full = count == Vec::size();
  Vec p = full ? Vec::loadu(param) : Vec::loadu(param, count);
  const Vec g = full ? Vec::loadu(grad) : Vec::loadu(grad, count);
  Vec m = full ? Vec::loadu(exp_avg) : Vec::loadu(exp_avg, count);
  Vec v = full ? Vec::loadu(exp_avg_sq) : Vec::loadu(exp_avg_sq, count);
  p = p * s.decay;
  m = at::vec::fmadd(g, s.one_minus_beta1, m * s.beta1);
  v = at::vec::fmadd(s.one_minus_beta2 * g, g, v * s.beta2);
  const Vec denom = v.sqrt() / s.sqrt_bias_correction2 + s.eps;
  p = p + s.neg_step_size * m / denom;
  if (full) {
    p.store(param);
    m.store(exp_avg);
    v.store(exp_avg_sq);
  } else {
    p.store(param, count);
    m.store(exp_avg, count);
    v.store(exp_avg_sq, count);
  }
  return p;
}

void adamw_kernel_impl(const AdamWScalars& scalars, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n) {
  const AdamWVecScalars s(scalars);
  constexpr int64_t kW = Vec::size();
  int64_t i = 0;
  // Two vectors per iteration: one bf16 vector holds 2 * kW elements.
  for (; i + 2 * kW <= n; i += 2 * kW) {
    const Vec p0 = adamw_vec(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i, kW);
    const Vec p1 = adamw_vec(s, param + i + kW, grad + i + kW, exp_avg + i + kW, exp_avg_sq + i + kW, kW);
    if (param_bf16 != nullptr) at::vec::convert_float_bfloat16(p0, p1).store(param_bf16 + i);
  }
  for (; i < n; i += kW) {
    const int64_t count = std::min(kW, n - i);
    const Vec p = adamw_vec(s, param + i, grad + i, exp_avg + i, exp_avg_sq + i, count);
    if (param_bf16 != nullptr) {
      float values[kW];
      p.store(values);
      for (int64_t k = 0; k < count; ++k) param_bf16[i + k] = c10::BFloat16(values[k]);
    }
  }
}

}  // namespace
}  // namespace strata
