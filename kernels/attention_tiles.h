#pragma once
// The building blocks of kernels/attention.cpp's tiled causal attention: an
// 8-wide float vector, e^x on it, a small register-blocked GEMM, the blocked
// transpose, the dropout hash, per-task scratch and a [B, H, T, D] head view.
//
// Include from attention.cpp only: that file is compiled with its own flags
// (-mavx2 -mfma, kernels/CMakeLists.txt), and these inline functions must not
// be instantiated with other flags in another translation unit (one
// definition each, or the linker could pick the wrong one).
#include <torch/torch.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace strata::kernels::tiles {

// Why GCC/Clang vector extensions and not at::vec::Vectorized<float>: the
// Debian LibTorch ships without sleef.h, which at::vec's AVX2/AVX-512
// specialisations include, and its generic Vectorized compiled with -mavx2
// here would emit inline functions with the same names as LibTorch's own
// (an ODR clash). An 8-wide vector type of our own compiles to one ymm register
// with -mavx2 -mfma (kernels/CMakeLists.txt) and to two xmm ones without.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
constexpr int kW = 8;

inline v8f load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

/// e^x, 8 lanes (Cephes expf: range reduction by ln 2, degree-5 polynomial,
/// 2^n through the exponent bits); relative error ~2e-7. Inputs below -87
/// give ~0, as exp() of a masked score should.
inline v8f vexp(v8f x) {
  x = x < splat(88.3762626647949f) ? x : splat(88.3762626647949f);
  x = x > splat(-87.3365478515625f) ? x : splat(-87.3365478515625f);
  v8f fx = x * splat(1.44269504088896341f) + splat(0.5f);
  v8i n = __builtin_convertvector(fx, v8i);
  v8f fn = __builtin_convertvector(n, v8f);
  n = fn > fx ? n - 1 : n;  // floor
  fn = __builtin_convertvector(n, v8f);
  x = x - fn * splat(0.693359375f) - fn * splat(-2.12194440e-4f);
  v8f y = splat(1.9875691500e-4f);
  y = y * x + splat(1.3981999507e-3f);
  y = y * x + splat(8.3334519073e-3f);
  y = y * x + splat(4.1665795894e-2f);
  y = y * x + splat(1.6666665459e-1f);
  y = y * x + splat(5.0000001201e-1f);
  y = y * x * x + x + splat(1.0f);
  v8i bits = (n + 127) << 23;
  v8f pow2;
  std::memcpy(&pow2, &bits, sizeof(pow2));
  return y * pow2;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// Row-major C[M, N] (+)= op(A)[M, K] · B[K, N]; N a multiple of 16 (callers
/// pad). op(A) is A [M, K] (lda between rows), or with TRANS_A the transpose
/// of a stored [K, M] (lda between its rows), which spares the backward its
/// tile transposes. Register-blocked: ROWS rows × 16 columns of C stay in
/// registers while K streams through (each B chunk loaded once for ROWS rows).
template <int ROWS, bool TRANS_A>
void gemm_rows(int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < N; j += 2 * kW) {
    v8f acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      acc[r][0] = accumulate ? load(C + r * ldc + j) : splat(0.f);
      acc[r][1] = accumulate ? load(C + r * ldc + j + kW) : splat(0.f);
    }
    for (int64_t k = 0; k < K; ++k) {
      const v8f b0 = load(B + k * ldb + j), b1 = load(B + k * ldb + j + kW);
      for (int r = 0; r < ROWS; ++r) {
        const v8f a = splat(TRANS_A ? A[k * lda + r] : A[r * lda + k]);
        acc[r][0] += a * b0;
        acc[r][1] += a * b1;
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      store(C + r * ldc + j, acc[r][0]);
      store(C + r * ldc + j + kW, acc[r][1]);
    }
  }
}

template <bool TRANS_A>
void gemm_impl(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  // Row i of op(A) starts at A + i·lda, or at column i (A + i) when transposed.
  auto a_at = [&](int64_t i) { return TRANS_A ? A + i : A + i * lda; };
  constexpr int kRows = 6;  // 12 accumulators + 2 B chunks + 1 broadcast: 15 of 16 ymm registers
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows) gemm_rows<kRows, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate);
  switch (M - i) {
    case 5: gemm_rows<5, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 4: gemm_rows<4, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 3: gemm_rows<3, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 2: gemm_rows<2, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    case 1: gemm_rows<1, TRANS_A>(N, K, a_at(i), lda, B, ldb, C + i * ldc, ldc, accumulate); break;
    default: break;
  }
}

/// C[M, N] (+)= A[M, K] · B[K, N] (A row-major with lda).
inline void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_impl<false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

/// C[M, N] (+)= Aᵀ · B[K, N] with A stored [K, M] (lda between its rows).
inline void gemm_tn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_impl<true>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

constexpr int64_t kBlockRows = 32;  // query rows per tile (smaller: less waste on the diagonal)
constexpr int64_t kBlockCols = 64;  // key columns per tile: a 64×64 fp32 score tile is 16 KiB (L1)

/// src [T, D] (leading dimension lds) transposed tile by tile: column tile
/// c0 / kBlockCols is a contiguous [D, kBlockCols] block at dst + c0·D. Why
/// blocked: a plain [D, T] transpose has rows 4·T bytes apart, which for T a
/// power of two map to the same L1 sets as the gemm walks down them.
inline void transpose_blocked(int64_t T, int64_t D, const float* src, int64_t lds, float* dst) {
  for (int64_t t = 0; t < T; ++t) {
    float* block = dst + (t / kBlockCols) * kBlockCols * D + t % kBlockCols;
    for (int64_t d = 0; d < D; ++d) block[d * kBlockCols] = src[t * lds + d];
  }
}

// Dropout: murmur3's 64-bit finaliser as the counter-based hash.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
/// Per (seed, batch·head, row): the key each column's draw derives from.
inline uint64_t row_key(uint64_t seed, int64_t bh, int64_t row) {
  return mix64(seed ^ mix64((static_cast<uint64_t>(bh) << 32) ^ static_cast<uint64_t>(row)));
}
/// Keep column `col` when the top 32 bits of its hash are >= p·2³².
inline bool keep(uint64_t key, int64_t col, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(key + static_cast<uint64_t>(col) * 0x9E3779B97F4A7C15ULL) >> 32) >=
         threshold;
}
inline uint32_t keep_threshold(double p) {
  return static_cast<uint32_t>(std::min(p * 4294967296.0, 4294967295.0));
}

/// Zero-filled fp32 scratch of one task, allocated as a tensor so that the
/// CPU memory tracker (trainer/memory.h) counts it like the naive path's.
class Scratch {
 public:
  explicit Scratch(int64_t n) : tensor_(torch::zeros({n}, torch::kFloat32)), data_(tensor_.data_ptr<float>()), n_(n) {}
  float* data() { return data_; }
  float* begin() { return data_; }
  float* end() { return data_ + n_; }
  float& operator[](int64_t i) { return data_[i]; }

 private:
  torch::Tensor tensor_;
  float* data_;
  int64_t n_;
};

/// out[d] = src[d] * scale in fp32, for fp32, bf16 and fp16 sources.
template <typename T>
inline void copy_scaled(const T* src, int64_t D, float scale, float* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(src[d]) * scale;
}

/// A [B, H, T, D] tensor's element (b, h, t, 0) read as fp32 rows: strides in
/// elements, D contiguous.
struct HeadView {
  const void* data;
  at::ScalarType dtype;
  int64_t sb, sh, st;
  int64_t H;          ///< the query heads bh counts
  int64_t group = 1;  ///< query heads per head of this tensor (grouped-query k, v)

  /// Copies rows [0, T) of (query) head bh into dst [T, ld] as fp32 times
  /// `scale`; of a grouped tensor, the head that query head reads.
  void rows_to(int64_t bh, int64_t T, int64_t D, float scale, float* dst, int64_t ld) const {
    const int64_t b = bh / H, h = (bh % H) / group;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t off = b * sb + h * sh + t * st;
      float* out = dst + t * ld;
      if (dtype == at::kFloat) {
        copy_scaled(static_cast<const float*>(data) + off, D, scale, out);
      } else if (dtype == at::kHalf) {
        copy_scaled(static_cast<const c10::Half*>(data) + off, D, scale, out);
      } else {
        copy_scaled(static_cast<const c10::BFloat16*>(data) + off, D, scale, out);
      }
    }
  }
};

/// `t` [B, Ht, T, D] as read for `heads` query heads (0: Ht): query head h
/// reads head h / (heads / Ht), transformers' repeat_kv order.
inline HeadView view_of(const torch::Tensor& t, int64_t heads = 0) {
  const int64_t H = heads > 0 ? heads : t.size(1);
  return {t.data_ptr(), t.scalar_type(), t.stride(0), t.stride(1), t.stride(2), H, H / t.size(1)};
}

/// D made contiguous (the kernels read rows); other strides stay as they are.
inline torch::Tensor rows_contiguous(const torch::Tensor& t) {
  return t.stride(3) == 1 ? t : t.contiguous();
}

/// An fp32 [B, H, T, D] tensor laid out as [B, T, H, D].
inline torch::Tensor empty_bthd(int64_t B, int64_t H, int64_t T, int64_t D) {
  return torch::empty({B, T, H, D}, torch::kFloat32).transpose(1, 2);
}

inline void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  double dropout_p) {
  TORCH_CHECK(q.dim() == 4, "causal attention: q must be [B, H, T, D] (got ", q.sizes(), ")");
  // k and v may have fewer heads (grouped queries), dividing q's.
  TORCH_CHECK(k.dim() == 4 && k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                  k.size(3) == q.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "causal attention: q [B, H, T, D], k and v [B, Hkv, T, D] with Hkv dividing H (got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes(), ")");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "causal attention: q, k, v must have one dtype (got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type(), ")");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf,
              "causal attention: dtype must be float32, bfloat16 or float16 (got ", q.scalar_type(), ")");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "causal attention: the fused kernel is CPU-only (got ", q.device(), ")");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "causal attention: dropout must be in [0, 1) (got ",
              dropout_p, ")");
}

}  // namespace strata::kernels::tiles
