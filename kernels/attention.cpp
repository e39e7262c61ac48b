#include "kernels/attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

namespace strata::kernels {
namespace {

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

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
          int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_impl<false>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

/// C[M, N] (+)= Aᵀ · B[K, N] with A stored [K, M] (lda between its rows).
void gemm_tn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
             int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  gemm_impl<true>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

constexpr int64_t kBlockRows = 32;  // query rows per tile (smaller: less waste on the diagonal)
constexpr int64_t kBlockCols = 64;  // key columns per tile: a 64×64 fp32 score tile is 16 KiB (L1)

/// src [T, D] (leading dimension lds) transposed tile by tile: column tile
/// c0 / kBlockCols is a contiguous [D, kBlockCols] block at dst + c0·D. Why
/// blocked: a plain [D, T] transpose has rows 4·T bytes apart, which for T a
/// power of two map to the same L1 sets as the gemm walks down them.
void transpose_blocked(int64_t T, int64_t D, const float* src, int64_t lds, float* dst) {
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
uint32_t keep_threshold(double p) {
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

/// A [B, H, T, D] tensor's element (b, h, t, 0) read as fp32 rows: strides in
/// elements, D contiguous.
struct HeadView {
  const void* data;
  at::ScalarType dtype;
  int64_t sb, sh, st;
  int64_t H;

  /// Copies rows [0, T) of head bh into dst [T, ld] as fp32 times `scale`.
  void rows_to(int64_t bh, int64_t T, int64_t D, float scale, float* dst, int64_t ld) const {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t off = b * sb + h * sh + t * st;
      float* out = dst + t * ld;
      if (dtype == at::kFloat) {
        const float* src = static_cast<const float*>(data) + off;
        for (int64_t d = 0; d < D; ++d) out[d] = src[d] * scale;
      } else {
        const c10::BFloat16* src = static_cast<const c10::BFloat16*>(data) + off;
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(src[d]) * scale;
      }
    }
  }
};

HeadView view_of(const torch::Tensor& t) {
  return {t.data_ptr(), t.scalar_type(), t.stride(0), t.stride(1), t.stride(2), t.size(1)};
}

/// D made contiguous (the kernels read rows); other strides stay as they are.
torch::Tensor rows_contiguous(const torch::Tensor& t) {
  return t.stride(3) == 1 ? t : t.contiguous();
}

/// An fp32 [B, H, T, D] tensor laid out as [B, T, H, D].
torch::Tensor empty_bthd(int64_t B, int64_t H, int64_t T, int64_t D) {
  return torch::empty({B, T, H, D}, torch::kFloat32).transpose(1, 2);
}

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  double dropout_p) {
  TORCH_CHECK(q.dim() == 4, "causal attention: q must be [B, H, T, D] (got ", q.sizes(), ")");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "causal attention: q, k, v must have one shape (got ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes(), ")");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "causal attention: q, k, v must have one dtype (got ", q.scalar_type(), ", ",
              k.scalar_type(), ", ", v.scalar_type(), ")");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "causal attention: dtype must be float32 or bfloat16 (got ", q.scalar_type(), ")");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "causal attention: the fused kernel is CPU-only (got ", q.device(), ")");
  TORCH_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "causal attention: dropout must be in [0, 1) (got ",
              dropout_p, ")");
}

}  // namespace

AttentionForward causal_attention_forward(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                          const torch::Tensor& v_in, double dropout_p,
                                          uint64_t seed) {
  check_inputs(q_in, k_in, v_in, dropout_p);
  const auto q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  auto out = empty_bthd(B, H, T, D);
  auto lse = torch::empty({B, H, T}, torch::kFloat32);
  if (q.numel() == 0) return {out.to(q.scalar_type()), lse, out};
  const HeadView qv = view_of(q), kv = view_of(k), vv = view_of(v);
  const int64_t Dp = round_up(D, 2 * kW), Tp = round_up(T, kBlockCols);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const bool dropout = dropout_p > 0.0;
  const uint32_t threshold = keep_threshold(dropout_p);
  const float keep_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  const int64_t osb = out.stride(0), osh = out.stride(1), ost = out.stride(2);

  // Why one task per batch·head: K and V of a head are converted once into
  // fp32 scratch shared by all its row tiles, and tasks never write the same
  // output rows (no synchronisation inside the kernel).
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Scratch qs(Tp * Dp), kt(D * Tp), vs(Tp * Dp), ks(Tp * Dp);
    Scratch s(kBlockRows * kBlockCols), acc(kBlockRows * Dp);
    Scratch m(kBlockRows), l(kBlockRows);
    for (int64_t bh = begin; bh < end; ++bh) {
      qv.rows_to(bh, T, D, scale, qs.data(), Dp);  // scaled once: S = (q·scale) kᵀ
      kv.rows_to(bh, T, D, 1.f, ks.data(), Dp);
      transpose_blocked(T, D, ks.data(), Dp, kt.data());
      vv.rows_to(bh, T, D, 1.f, vs.data(), Dp);
      const int64_t b = bh / H, h = bh % H;
      for (int64_t r0 = 0; r0 < T; r0 += kBlockRows) {
        const int64_t R = std::min(kBlockRows, T - r0);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.f);
        std::fill(acc.begin(), acc.end(), 0.f);
        // Tiles entirely above the diagonal (c0 > last row) are never visited.
        for (int64_t c0 = 0; c0 < r0 + R; c0 += kBlockCols) {
          const int64_t C = std::min(kBlockCols, r0 + R - c0);
          const int64_t Cp = round_up(C, 2 * kW);
          gemm(R, Cp, D, qs.data() + r0 * Dp, Dp, kt.data() + c0 * D, kBlockCols, s.data(), kBlockCols, false);
          for (int64_t i = 0; i < R; ++i) {
            const int64_t row = r0 + i;
            float* si = s.data() + i * kBlockCols;
            const int64_t valid = std::min(C, row + 1 - c0);  // causal: columns <= row
            if (valid <= 0) {
              std::fill(si, si + Cp, 0.f);
              continue;
            }
            v8f vmax = splat(m[i]);
            int64_t c = 0;
            for (; c + kW <= valid; c += kW) {
              const v8f x = load(si + c);
              vmax = x > vmax ? x : vmax;
            }
            float mx = m[i];
            for (int w = 0; w < kW; ++w) mx = std::max(mx, vmax[w]);
            for (; c < valid; ++c) mx = std::max(mx, si[c]);
            // Online softmax: rescale what was accumulated under the old max.
            const float alpha = std::exp(m[i] - mx);
            m[i] = mx;
            const v8f vmx = splat(mx);
            v8f vsum = splat(0.f);
            for (c = 0; c < Cp; c += kW) store(si + c, vexp(load(si + c) - vmx));
            std::fill(si + valid, si + Cp, 0.f);
            for (c = 0; c < Cp; c += kW) vsum += load(si + c);
            float sum = 0.f;
            for (int w = 0; w < kW; ++w) sum += vsum[w];
            l[i] = l[i] * alpha + sum;  // the normaliser counts dropped entries too
            if (dropout) {
              const uint64_t key = row_key(seed, bh, row);
              for (c = 0; c < valid; ++c) si[c] = keep(key, c0 + c, threshold) ? si[c] * keep_scale : 0.f;
            }
            float* ai = acc.data() + i * Dp;
            const v8f va = splat(alpha);
            for (int64_t d = 0; d < Dp; d += kW) store(ai + d, load(ai + d) * va);
          }
          gemm(R, Dp, Cp, s.data(), kBlockCols, vs.data() + c0 * Dp, Dp, acc.data(), Dp, true);
        }
        for (int64_t i = 0; i < R; ++i) {
          const int64_t row = r0 + i;
          const float inv = 1.f / l[i];
          float* o = out_data + b * osb + h * osh + row * ost;
          const float* ai = acc.data() + i * Dp;
          for (int64_t d = 0; d < D; ++d) o[d] = ai[d] * inv;
          lse_data[bh * T + row] = m[i] + std::log(l[i]);
        }
      }
    }
  });
  return {q.scalar_type() == at::kFloat ? out : out.to(q.scalar_type()), lse, out};
}

AttentionGrads causal_attention_backward(const torch::Tensor& grad_out_in, const torch::Tensor& q_in,
                                         const torch::Tensor& k_in, const torch::Tensor& v_in,
                                         const torch::Tensor& out_in, const torch::Tensor& lse,
                                         double dropout_p, uint64_t seed) {
  check_inputs(q_in, k_in, v_in, dropout_p);
  TORCH_CHECK(grad_out_in.sizes() == q_in.sizes() && out_in.sizes() == q_in.sizes(),
              "causal attention backward: grad_out ", grad_out_in.sizes(), " and out ",
              out_in.sizes(), " must match q ", q_in.sizes());
  const auto q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  // dO and O may come in another dtype than q (the fp32 output of bf16 inputs,
  // fp32 gradients of a bf16 output): read fp32 and bf16 as they are.
  auto readable = [](const torch::Tensor& t) {
    const bool ok = t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
    return rows_contiguous(ok ? t : t.to(at::kFloat));
  };
  auto grad_out = readable(grad_out_in);
  auto out = readable(out_in);
  const auto lse_c = lse.to(torch::kFloat32).contiguous();
  TORCH_CHECK(lse_c.numel() == B * H * T, "causal attention backward: lse has ", lse_c.numel(),
              " elements, expected B·H·T = ", B * H * T);
  auto dq = empty_bthd(B, H, T, D), dk = empty_bthd(B, H, T, D), dv = empty_bthd(B, H, T, D);
  if (q.numel() > 0) {
    const HeadView qv = view_of(q), kv = view_of(k), vv = view_of(v), gv = view_of(grad_out),
                   ov = view_of(out);  // out: fp32 or q's dtype
    const int64_t Dp = round_up(D, 2 * kW), Tp = round_up(T, kBlockCols);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const bool dropout = dropout_p > 0.0;
    const uint32_t threshold = keep_threshold(dropout_p);
    const float keep_scale = static_cast<float>(1.0 / (1.0 - dropout_p));
    const float* lse_data = lse_c.data_ptr<float>();
    float* dq_data = dq.data_ptr<float>();
    float* dk_data = dk.data_ptr<float>();
    float* dv_data = dv.data_ptr<float>();
    const int64_t gsb = dq.stride(0), gsh = dq.stride(1), gst = dq.stride(2);

    // Why one task per batch·head: dK/dV of a column tile sum over row tiles
    // and dQ of a row tile over column tiles; within one head a single task
    // does both, so no two tasks ever add into the same gradient rows.
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      Scratch qs(Tp * Dp), ks(Tp * Dp), kt(D * Tp), vs(Tp * Dp),
          vt(D * Tp), dos(Tp * Dp), os(Tp * Dp), dqa(Tp * Dp);
      Scratch delta(Tp);
      Scratch p(kBlockRows * kBlockCols), ds(kBlockRows * kBlockCols),
          pd(kBlockRows * kBlockCols), dkv(kBlockCols * Dp), dva(kBlockCols * Dp);
      std::vector<uint8_t> z(kBlockRows * kBlockCols);
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / H, h = bh % H;
        qv.rows_to(bh, T, D, scale, qs.data(), Dp);
        kv.rows_to(bh, T, D, 1.f, ks.data(), Dp);
        transpose_blocked(T, D, ks.data(), Dp, kt.data());
        vv.rows_to(bh, T, D, 1.f, vs.data(), Dp);
        transpose_blocked(T, D, vs.data(), Dp, vt.data());
        gv.rows_to(bh, T, D, 1.f, dos.data(), Dp);
        ov.rows_to(bh, T, D, 1.f, os.data(), Dp);
        // delta_i = rowsum(dO ∘ O) = rowsum(P ∘ dP), dropout included.
        for (int64_t t = 0; t < T; ++t) {
          float sum = 0.f;
          for (int64_t d = 0; d < D; ++d) sum += dos[t * Dp + d] * os[t * Dp + d];
          delta[t] = sum;
        }
        std::fill(dqa.begin(), dqa.end(), 0.f);
        const float* lse_row = lse_data + bh * T;
        for (int64_t c0 = 0; c0 < T; c0 += kBlockCols) {
          const int64_t C = std::min(kBlockCols, T - c0);
          std::fill(dkv.begin(), dkv.end(), 0.f);
          std::fill(dva.begin(), dva.end(), 0.f);
          // Only row tiles reaching the diagonal: rows < c0 see none of these columns.
          for (int64_t r0 = c0 / kBlockRows * kBlockRows; r0 < T; r0 += kBlockRows) {
            const int64_t R = std::min(kBlockRows, T - r0);
            // Columns some row of this tile sees: on the diagonal fewer than C.
            const int64_t Ce = round_up(std::min(C, r0 + R - c0), 2 * kW);
            gemm(R, Ce, D, qs.data() + r0 * Dp, Dp, kt.data() + c0 * D, kBlockCols, p.data(), kBlockCols, false);
            // P (recomputed from the logsumexp), and with dropout the dropped-out P.
            for (int64_t i = 0; i < R; ++i) {
              const int64_t row = r0 + i;
              float* pi = p.data() + i * kBlockCols;
              const int64_t valid = std::max<int64_t>(0, std::min(C, row + 1 - c0));
              const v8f vl = splat(lse_row[row]);
              for (int64_t c = 0; c < Ce; c += kW) store(pi + c, vexp(load(pi + c) - vl));
              std::fill(pi + valid, pi + Ce, 0.f);
              uint8_t* zi = z.data() + i * kBlockCols;
              if (dropout) {
                const uint64_t key = row_key(seed, bh, row);
                for (int64_t c = 0; c < valid; ++c) zi[c] = keep(key, c0 + c, threshold);
              }
              float* pdi = pd.data() + i * kBlockCols;  // the dropped-out P
              if (dropout) {
                for (int64_t c = 0; c < Ce; ++c) pdi[c] = c < valid && zi[c] ? pi[c] * keep_scale : 0.f;
              }
            }
            // dV += (dropped P)ᵀ dO
            gemm_tn(Ce, Dp, R, dropout ? pd.data() : p.data(), kBlockCols, dos.data() + r0 * Dp, Dp,
                    dva.data(), Dp, true);
            // dP (of the dropped P) = dO Vᵀ
            gemm(R, Ce, D, dos.data() + r0 * Dp, Dp, vt.data() + c0 * D, kBlockCols, ds.data(), kBlockCols, false);
            for (int64_t i = 0; i < R; ++i) {
              const int64_t row = r0 + i;
              const float* pi = p.data() + i * kBlockCols;
              float* dsi = ds.data() + i * kBlockCols;
              const uint8_t* zi = z.data() + i * kBlockCols;
              const int64_t valid = std::max<int64_t>(0, std::min(C, row + 1 - c0));
              if (dropout) {
                for (int64_t c = 0; c < valid; ++c) dsi[c] = zi[c] ? dsi[c] * keep_scale : 0.f;
              }
              // dS = P ∘ (dP - delta); P is 0 outside the valid columns.
              const v8f vd = splat(delta[row]);
              for (int64_t c = 0; c < Ce; c += kW) store(dsi + c, load(pi + c) * (load(dsi + c) - vd));
            }
            // dK += dSᵀ (q·scale); dQ += dS K (times scale at the end)
            gemm_tn(Ce, Dp, R, ds.data(), kBlockCols, qs.data() + r0 * Dp, Dp, dkv.data(), Dp, true);
            gemm(R, Dp, Ce, ds.data(), kBlockCols, ks.data() + c0 * Dp, Dp, dqa.data() + r0 * Dp, Dp, true);
          }
          for (int64_t c = 0; c < C; ++c) {
            const int64_t off = b * gsb + h * gsh + (c0 + c) * gst;
            std::memcpy(dk_data + off, dkv.data() + c * Dp, D * sizeof(float));
            std::memcpy(dv_data + off, dva.data() + c * Dp, D * sizeof(float));
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          float* o = dq_data + b * gsb + h * gsh + t * gst;
          for (int64_t d = 0; d < D; ++d) o[d] = dqa[t * Dp + d] * scale;
        }
      }
    });
  }
  const auto dtype = q.scalar_type();
  if (dtype == at::kFloat) return {dq, dk, dv};
  return {dq.to(dtype), dk.to(dtype), dv.to(dtype)};
}

namespace {

/// The autograd node: saves q, k, v, the fp32 output and the logsumexp, plus the
/// dropout probability and seed from which the backward regenerates the mask.
class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, double dropout_p,
                               int64_t seed) {
    auto result = causal_attention_forward(q, k, v, dropout_p, static_cast<uint64_t>(seed));
    // The fp32 output (for bf16 inputs a second, fp32 copy: B·T·C floats).
    ctx->save_for_backward({q, k, v, result.out_fp32, result.lse});
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["seed"] = seed;
    return result.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto g = causal_attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                                       ctx->saved_data["dropout_p"].toDouble(),
                                       static_cast<uint64_t>(ctx->saved_data["seed"].toInt()));
    return {g.dq, g.dk, g.dv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

uint64_t draw_dropout_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  // The generator's own mutex: thread ranks and data loaders share it.
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::check_generator<at::CPUGeneratorImpl>(gen)->random64();
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p, bool training) {
  const double p = training ? dropout_p : 0.0;
  const uint64_t seed = p > 0.0 ? draw_dropout_seed() : 0;
  return CausalAttentionFunction::apply(q, k, v, p, static_cast<int64_t>(seed));
}

torch::Tensor dropout_keep_mask(int64_t batch_heads, int64_t T, double dropout_p, uint64_t seed) {
  TORCH_CHECK(batch_heads >= 0 && T >= 0, "dropout_keep_mask: sizes must be >= 0 (got ",
              batch_heads, ", ", T, ")");
  auto mask = torch::empty({batch_heads, T, T}, torch::kBool);
  bool* data = mask.data_ptr<bool>();
  const uint32_t threshold = keep_threshold(dropout_p);
  at::parallel_for(0, batch_heads * T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint64_t key = row_key(seed, r / T, r % T);
      for (int64_t c = 0; c < T; ++c) data[r * T + c] = keep(key, c, threshold);
    }
  });
  return mask;
}

torch::Tensor naive_causal_probs(const torch::Tensor& q, const torch::Tensor& k) {
  const auto T = q.size(-2);
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  // Causal mask: position t attends to positions <= t only.
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::softmax(att, -1);
}

torch::Tensor naive_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& keep_mask,
                                     double dropout_p) {
  auto att = naive_causal_probs(q, k);
  if (keep_mask.defined()) {
    att = att * keep_mask.view(att.sizes()).to(att.scalar_type()) * (1.0 / (1.0 - dropout_p));
  }
  return torch::matmul(att, v);
}

}  // namespace strata::kernels
