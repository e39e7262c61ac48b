// The AdamW kernel for x86-64 with AVX2 and FMA, in intrinsics: compiled with
// -mavx2 -mfma (kernels/CMakeLists.txt) and called only after a CPU check
// (fused_adamw.cpp). Why not at::vec::Vectorized<float> as in
// fused_adamw_kernel.h: its AVX2 header needs SLEEF's sleef.h, which the
// LibTorch packages do not install.
//
// The same op-by-op arithmetic as fused_adamw_kernel.h: 8 lanes, each rounded
// exactly as LibTorch 1.13's vectorised CPU kernels round (bit-identical to
// torch::optim::AdamW here: FusedAdamWIsaTest). Two of torch's ops end in a
// fused multiply-add: add_(g, alpha) is vec::fmadd, and addcmul_'s
// "self + s * t1 * t2" is contracted by the compiler LibTorch was built with
// into fma(s * t1, t2, self); both are written as explicit FMAs here, and
// this file is compiled with -ffp-contract=off so that nothing else is fused
// (GCC would otherwise fuse "p * decay + update" and break bit-equality).
#include "strata/kernels/adamw_scalars.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace strata {
namespace {

struct Avx2Scalars {
  explicit Avx2Scalars(const AdamWScalars& s)
      : decay(_mm256_set1_ps(s.decay)),
        beta1(_mm256_set1_ps(s.beta1)),
        one_minus_beta1(_mm256_set1_ps(s.one_minus_beta1)),
        beta2(_mm256_set1_ps(s.beta2)),
        one_minus_beta2(_mm256_set1_ps(s.one_minus_beta2)),
        sqrt_bias_correction2(_mm256_set1_ps(s.sqrt_bias_correction2)),
        eps(_mm256_set1_ps(s.eps)),
        neg_step_size(_mm256_set1_ps(s.neg_step_size)) {}
  __m256 decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bias_correction2, eps, neg_step_size;
};

/// 8 elements in registers; returns the new param, updates m and v.
inline __m256 adamw8(const Avx2Scalars& s, __m256 p, __m256 g, __m256& m, __m256& v) {
  p = _mm256_mul_ps(p, s.decay);                                             // p.mul_(decay)
  m = _mm256_fmadd_ps(g, s.one_minus_beta1, _mm256_mul_ps(m, s.beta1));      // mul_, add_(g, alpha)
  v = _mm256_fmadd_ps(_mm256_mul_ps(s.one_minus_beta2, g), g, _mm256_mul_ps(v, s.beta2));  // mul_, addcmul_
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), s.sqrt_bias_correction2), s.eps);
  return _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(s.neg_step_size, m), denom));  // addcdiv_
}

/// fp32 -> bf16 bits, round to nearest even, NaN -> 0x7fc0 (c10::BFloat16's rule).
inline __m256i bf16_bits(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
}

/// The same rule for one value. Not c10::BFloat16(float): an out-of-line copy
/// of that inline constructor compiled here (with AVX2 enabled) could be the
/// one the linker keeps for every other file too.
inline uint16_t bf16_bits(float x) {
  if (x != x) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>((u + ((u >> 16) & 1u) + 0x7fffu) >> 16);
}

/// 16 bf16 values from two vectors of 8, in order.
inline void store_bf16(c10::BFloat16* out, __m256 a, __m256 b) {
  // packus works per 128-bit lane: [a0-3 b0-3 | a4-7 b4-7]; permute to a0-7 b0-7.
  const __m256i packed = _mm256_packus_epi32(bf16_bits(a), bf16_bits(b));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute4x64_epi64(packed, 0xD8));
}

}  // namespace

void adamw_kernel_avx2(const AdamWScalars& scalars, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n) {
  const Avx2Scalars s(scalars);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 m0 = _mm256_loadu_ps(exp_avg + i), m1 = _mm256_loadu_ps(exp_avg + i + 8);
    __m256 v0 = _mm256_loadu_ps(exp_avg_sq + i), v1 = _mm256_loadu_ps(exp_avg_sq + i + 8);
    const __m256 p0 = adamw8(s, _mm256_loadu_ps(param + i), _mm256_loadu_ps(grad + i), m0, v0);
    const __m256 p1 = adamw8(s, _mm256_loadu_ps(param + i + 8), _mm256_loadu_ps(grad + i + 8), m1, v1);
    _mm256_storeu_ps(param + i, p0);
    _mm256_storeu_ps(param + i + 8, p1);
    _mm256_storeu_ps(exp_avg + i, m0);
    _mm256_storeu_ps(exp_avg + i + 8, m1);
    _mm256_storeu_ps(exp_avg_sq + i, v0);
    _mm256_storeu_ps(exp_avg_sq + i + 8, v1);
    if (param_bf16 != nullptr) store_bf16(param_bf16 + i, p0, p1);
  }
  // Tail (< 16 elements): through zero-padded buffers, the same lane math.
  for (; i < n; i += 8) {
    const int64_t count = std::min<int64_t>(8, n - i);
    alignas(32) float p[8] = {}, g[8] = {}, m[8] = {}, v[8] = {};
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    std::memcpy(p, param + i, bytes);
    std::memcpy(g, grad + i, bytes);
    std::memcpy(m, exp_avg + i, bytes);
    std::memcpy(v, exp_avg_sq + i, bytes);
    __m256 mv = _mm256_load_ps(m), vv = _mm256_load_ps(v);
    _mm256_store_ps(p, adamw8(s, _mm256_load_ps(p), _mm256_load_ps(g), mv, vv));
    _mm256_store_ps(m, mv);
    _mm256_store_ps(v, vv);
    std::memcpy(param + i, p, bytes);
    std::memcpy(exp_avg + i, m, bytes);
    std::memcpy(exp_avg_sq + i, v, bytes);
    if (param_bf16 != nullptr) {
      for (int64_t k = 0; k < count; ++k) param_bf16[i + k].x = bf16_bits(p[k]);
    }
  }
}

}  // namespace strata
