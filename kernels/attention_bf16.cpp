#include "strata/kernels/attention_bf16.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <string>

// x86-64 compilers that know AVX512-BF16 (GCC 10, Clang 9 and later);
// elsewhere available() is false and bf16 inputs take the fp32 tiles.
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define STRATA_HAVE_AVX512_BF16 1
#include <immintrin.h>
#else
#define STRATA_HAVE_AVX512_BF16 0
#endif

// Why per-function targets: this file is compiled with attention.cpp's flags
// (-mavx2 -mfma), so the tile steps both include (attention_steps.h) are the
// same code in both; only the functions below use AVX-512 and AVX512-BF16,
// and they run only where available() said the CPU has them.
#define STRATA_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace strata::kernels::bf16 {
#if STRATA_HAVE_AVX512_BF16
namespace {

using namespace tiles;  // NOLINT: the tiles' layout and steps

/// Two bf16 in 32 bits, the first in the low half: VDPBF16PS's operand unit.
using Pair = uint32_t;

/// ROWS rows of C[., N] = alpha · A·B (+ C): A holds each row's K2 pairs (lda
/// pairs apart), B K2 rows of N pairs (the pair at (kk, n) is B[2kk][n],
/// B[2kk+1][n]; ldb pairs apart). N a multiple of 16; 2·ROWS accumulators
/// stay in zmm registers while the pairs stream through.
template <int ROWS>
STRATA_AVX512_BF16 void gemm_rows(int64_t N, int64_t K2, const Pair* A, int64_t lda, const Pair* B, int64_t ldb,
                                  float* C, int64_t ldc, float alpha, bool accumulate) {
  const __m512 va = _mm512_set1_ps(alpha);
  for (int64_t j = 0; j < N; j += 32) {
    const int halves = j + 32 <= N ? 2 : 1;
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    if (halves == 2) {
      for (int64_t k = 0; k < K2; ++k) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + k * ldb + j);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(B + k * ldb + j + 16);
        for (int r = 0; r < ROWS; ++r) {
          const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[r * lda + k]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
      }
    } else {
      for (int64_t k = 0; k < K2; ++k) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(B + k * ldb + j);
        for (int r = 0; r < ROWS; ++r) {
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)_mm512_set1_epi32(static_cast<int>(A[r * lda + k])), b0);
        }
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      for (int h = 0; h < halves; ++h) {
        float* c = C + r * ldc + j + 16 * h;
        __m512 v = _mm512_mul_ps(acc[r][h], va);
        if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(c));
        _mm512_storeu_ps(c, v);
      }
    }
  }
}

/// C[M, N] = alpha · A·B (+ C), A and B as gemm_rows takes them.
STRATA_AVX512_BF16 void gemm(int64_t M, int64_t N, int64_t K2, const Pair* A, int64_t lda, const Pair* B,
                             int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate) {
  constexpr int kRows = 8;  // 16 accumulators + 2 B chunks + 1 broadcast of 32 zmm registers
  int64_t i = 0;
  for (; i + kRows <= M; i += kRows) gemm_rows<kRows>(N, K2, A + i * lda, lda, B, ldb, C + i * ldc, ldc, alpha, accumulate);
  const Pair* a = A + i * lda;
  float* c = C + i * ldc;
  switch (M - i) {
    case 7: gemm_rows<7>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 6: gemm_rows<6>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 5: gemm_rows<5>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 4: gemm_rows<4>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 3: gemm_rows<3>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 2: gemm_rows<2>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    case 1: gemm_rows<1>(N, K2, a, lda, B, ldb, c, ldc, alpha, accumulate); break;
    default: break;
  }
}

/// [a0..a15 | b0..b15] (16-bit lanes) -> a0 b0 a1 b1 ... a15 b15.
STRATA_AVX512_BF16 __m512i interleave(__m512i halves) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, halves);
}

/// Pairs along rows of fp32 src (`rows` rows, lds apart; N columns, a
/// multiple of 16), rounded to bf16: dst[rr][n] = (src[2rr][n], src[2rr+1][n]);
/// a missing last odd row reads as 0.
STRATA_AVX512_BF16 void pair_rows(const float* src, int64_t lds, int64_t rows, int64_t N, Pair* dst, int64_t ldd) {
  for (int64_t rr = 0; 2 * rr < rows; ++rr) {
    const float* a = src + 2 * rr * lds;
    const bool second = 2 * rr + 1 < rows;
    for (int64_t n = 0; n < N; n += 16) {
      const __m512 fa = _mm512_loadu_ps(a + n);
      const __m512 fb = second ? _mm512_loadu_ps(a + lds + n) : _mm512_setzero_ps();
      // cvtne2ps_pbh(hi, lo): lanes 0-15 from lo, 16-31 from hi.
      _mm512_storeu_si512(dst + rr * ldd + n, interleave((__m512i)_mm512_cvtne2ps_pbh(fb, fa)));
    }
  }
}

/// The same from bf16 rows (no rounding): `rows` even or src zero past them.
STRATA_AVX512_BF16 void pair_rows(const uint16_t* src, int64_t lds, int64_t rows, int64_t N, Pair* dst, int64_t ldd) {
  // Lane 2i: a's i-th, lane 2i+1: b's (index 32 + i: the second operand).
  const __m512i kTwoRows = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (int64_t rr = 0; 2 * rr < rows; ++rr) {
    const uint16_t* a = src + 2 * rr * lds;
    for (int64_t n = 0; n < N; n += 16) {
      // 16 bf16 of each row in the low half (masked loads: no undefined upper half).
      const __m512i ha = _mm512_maskz_loadu_epi16(0xFFFF, a + n);
      const __m512i hb = _mm512_maskz_loadu_epi16(0xFFFF, a + lds + n);
      _mm512_storeu_si512(dst + rr * ldd + n, _mm512_permutex2var_epi16(ha, kTwoRows, hb));
    }
  }
}

/// fp32 rows (N a multiple of 16) rounded to bf16 rows: each row's pairs are
/// then an A operand.
STRATA_AVX512_BF16 void rows_to_bf16(const float* src, int64_t lds, int64_t rows, int64_t N, uint16_t* dst,
                                     int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t n = 0; n < N; n += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ldd + n),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + r * lds + n)));
    }
  }
}

/// dst[c][r] = src[r][c] for a [rows, cols] matrix of pairs.
void transpose_pairs(const Pair* src, int64_t rows, int64_t cols, Pair* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

/// Rows [0, T) of head bh of a bf16 [B, H, T, D] view copied as they are into
/// dst [T, ld] (columns past D keep their zeros).
void raw_rows(const HeadView& view, int64_t bh, int64_t T, int64_t D, uint16_t* dst, int64_t ld) {
  const auto* data = static_cast<const uint16_t*>(view.data);
  const int64_t b = bh / view.H, h = (bh % view.H) / view.group;
  for (int64_t t = 0; t < T; ++t) std::memcpy(dst + t * ld, data + b * view.sb + h * view.sh + t * view.st, D * 2);
}

/// Zero-filled scratch of one task (tensors: the CPU memory tracker counts them).
template <typename T>
class Buffer {
 public:
  explicit Buffer(int64_t n)
      : tensor_(torch::zeros({n}, sizeof(T) == 2 ? torch::kInt16 : sizeof(T) == 4 ? torch::kInt32 : torch::kUInt8)),
        data_(static_cast<T*>(tensor_.data_ptr())) {}
  // The pointer kept: data_ptr()'s checks cost more than the tiles' inner loops.
  T* data() const { return data_; }
  Pair* pairs() const { return reinterpret_cast<Pair*>(data_); }

 private:
  torch::Tensor tensor_;
  T* data_;
};

/// One head's q, k, v as bf16 rows and the packed operands both passes use.
struct HeadOperands {
  HeadOperands(int64_t Tp, int64_t Dp) : q(Tp * Dp), k(Tp * Dp), v(Tp * Dp), kt(Tp * Dp / 2), Tp(Tp), Dp(Dp) {}
  Buffer<uint16_t> q, k, v;  ///< [Tp, Dp] rows: A operands along D
  Buffer<Pair> kt;           ///< [Dp/2, Tp]: kᵀ's pairs along D, the B of S = q kᵀ
  int64_t Tp, Dp;

  void load(const HeadView& qv, const HeadView& kv, const HeadView& vv, int64_t bh, int64_t T, int64_t D) {
    raw_rows(qv, bh, T, D, q.data(), Dp);
    raw_rows(kv, bh, T, D, k.data(), Dp);
    raw_rows(vv, bh, T, D, v.data(), Dp);
    transpose_pairs(k.pairs(), Tp, Dp / 2, kt.pairs());
  }
};

struct ForwardScratch {
  ForwardScratch(int64_t Tp, int64_t Dp)
      : in(Tp, Dp), vp(Tp * Dp / 2), s(kBlockRows * kBlockCols), p(kBlockRows * kBlockCols),
        acc(kBlockRows * Dp), m(kBlockRows), l(kBlockRows) {}
  HeadOperands in;
  Buffer<Pair> vp;  ///< [Tp/2, Dp]: v's pairs along T, the B of P·v
  Buffer<float> s;
  Buffer<uint16_t> p;
  Buffer<float> acc, m, l;
};

/// Output rows [r0, r0 + R) of head bh, as the fp32 forward_row_tile.
STRATA_AVX512_BF16 void forward_row_tile(const TileShape& ts, int64_t bh, int64_t r0, ForwardScratch& w,
                                         float* out_rows, int64_t ost, float* lse_rows) {
  const int64_t R = std::min(kBlockRows, ts.T - r0), Dp = ts.Dp, Tp = w.in.Tp;
  std::fill(w.m.data(), w.m.data() + kBlockRows, -std::numeric_limits<float>::infinity());
  std::fill(w.l.data(), w.l.data() + kBlockRows, 0.f);
  std::fill(w.acc.data(), w.acc.data() + kBlockRows * Dp, 0.f);
  for (int64_t c0 = 0; c0 < r0 + R; c0 += kBlockCols) {
    const int64_t C = std::min(kBlockCols, r0 + R - c0);
    const int64_t Cp = round_up(C, 2 * kW);
    gemm(R, Cp, Dp / 2, w.in.q.pairs() + r0 * Dp / 2, Dp / 2, w.in.kt.pairs() + c0, Tp, w.s.data(), kBlockCols,
         ts.scale, false);
    online_softmax_tile(ts, bh, r0, R, c0, C, w.s.data(), w.m.data(), w.l.data(), w.acc.data());
    rows_to_bf16(w.s.data(), kBlockCols, R, Cp, w.p.data(), kBlockCols);
    gemm(R, Dp, Cp / 2, w.p.pairs(), kBlockCols / 2, w.vp.pairs() + (c0 / 2) * Dp, Dp, w.acc.data(), Dp, 1.f, true);
  }
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = r0 + i;
    const float inv = 1.f / w.l.data()[i];
    float* o = out_rows + row * ost;
    const float* ai = w.acc.data() + i * Dp;
    for (int64_t d = 0; d < ts.D; ++d) o[d] = ai[d] * inv;
    lse_rows[row] = w.m.data()[i] + std::log(w.l.data()[i]);
  }
}

struct BackwardScratch {
  BackwardScratch(int64_t Tp, int64_t Dp)
      : in(Tp, Dp), dos(Tp * Dp), os(Tp * Dp), dob(Tp * Dp), vt(Tp * Dp / 2), kp(Tp * Dp / 2), qt(Tp * Dp / 2),
        dot(Tp * Dp / 2), work(Tp * Dp / 2), dqa(Tp * Dp), delta(Tp), p(kBlockRows * kBlockCols),
        pd(kBlockRows * kBlockCols), ds(kBlockRows * kBlockCols), z(kBlockRows * kBlockCols),
        pp(kBlockRows * kBlockCols / 2), dsp(kBlockRows * kBlockCols / 2), dsr(kBlockRows * kBlockCols),
        dvt(Dp * kBlockCols), dkt(Dp * kBlockCols) {}
  HeadOperands in;
  Buffer<float> dos, os;         ///< dO and O as fp32 rows (for delta)
  Buffer<uint16_t> dob;          ///< dO as bf16 rows: the A of dP = dO vᵀ
  Buffer<Pair> vt, kp, qt, dot;  ///< vᵀ along D; k along T; qᵀ and dOᵀ rows of pairs along T
  Buffer<Pair> work;             ///< pairs along T before their transpose
  Buffer<float> dqa, delta, p, pd, ds;
  Buffer<uint8_t> z;
  Buffer<Pair> pp, dsp;          ///< a tile's (dropped) P and dS, pairs along its rows
  Buffer<uint16_t> dsr;          ///< a tile's dS as bf16 rows
  Buffer<float> dvt, dkt;        ///< dVᵀ, dKᵀ [Dp, kBlockCols] of a column tile
};

/// Head bh's operands, dO, O and delta = rowsum(dO ∘ O) into w.
STRATA_AVX512_BF16 void load_backward_head(const TileShape& ts, int64_t bh, const HeadView& q, const HeadView& k,
                                           const HeadView& v, const HeadView& grad_out, const HeadView& out,
                                           BackwardScratch& w) {
  const int64_t T = ts.T, D = ts.D, Dp = ts.Dp, Tp = w.in.Tp;
  w.in.load(q, k, v, bh, T, D);
  transpose_pairs(w.in.v.pairs(), Tp, Dp / 2, w.vt.pairs());
  pair_rows(w.in.k.data(), Dp, Tp, Dp, w.kp.pairs(), Dp);
  pair_rows(w.in.q.data(), Dp, Tp, Dp, w.work.pairs(), Dp);
  transpose_pairs(w.work.pairs(), Tp / 2, Dp, w.qt.pairs());
  grad_out.rows_to(bh, T, D, 1.f, w.dos.data(), Dp);
  out.rows_to(bh, T, D, 1.f, w.os.data(), Dp);
  rows_to_bf16(w.dos.data(), Dp, Tp, Dp, w.dob.data(), Dp);
  pair_rows(w.dob.data(), Dp, Tp, Dp, w.work.pairs(), Dp);
  transpose_pairs(w.work.pairs(), Tp / 2, Dp, w.dot.pairs());
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.f;
    for (int64_t d = 0; d < D; ++d) sum += w.dos.data()[t * Dp + d] * w.os.data()[t * Dp + d];
    w.delta.data()[t] = sum;
  }
  std::fill(w.dqa.data(), w.dqa.data() + Tp * Dp, 0.f);
}

/// Key/value columns [c0, c0 + C): dKᵀ and dVᵀ in w.dkt, w.dvt over the row
/// tiles that see them, dQ of those rows into w.dqa (times scale at the end).
STRATA_AVX512_BF16 void backward_column_tile(const TileShape& ts, int64_t bh, int64_t c0, const float* lse_row,
                                             BackwardScratch& w) {
  const int64_t C = std::min(kBlockCols, ts.T - c0), Dp = ts.Dp, Tp = w.in.Tp;
  std::fill(w.dvt.data(), w.dvt.data() + Dp * kBlockCols, 0.f);
  std::fill(w.dkt.data(), w.dkt.data() + Dp * kBlockCols, 0.f);
  for (int64_t r0 = c0 / kBlockRows * kBlockRows; r0 < ts.T; r0 += kBlockRows) {
    const int64_t R = std::min(kBlockRows, ts.T - r0), R2 = (R + 1) / 2;
    const int64_t Ce = round_up(std::min(C, r0 + R - c0), 2 * kW);
    gemm(R, Ce, Dp / 2, w.in.q.pairs() + r0 * Dp / 2, Dp / 2, w.in.kt.pairs() + c0, Tp, w.p.data(), kBlockCols,
         ts.scale, false);
    recompute_probs_tile(ts, bh, r0, R, c0, C, Ce, lse_row, w.p.data(), w.pd.data(), w.z.data());
    // dVᵀ += dOᵀ (dropped P)
    pair_rows(ts.dropout ? w.pd.data() : w.p.data(), kBlockCols, R, Ce, w.pp.pairs(), kBlockCols);
    gemm(Dp, Ce, R2, w.dot.pairs() + r0 / 2, Tp / 2, w.pp.pairs(), kBlockCols, w.dvt.data(), kBlockCols, 1.f, true);
    // dP (of the dropped P) = dO vᵀ
    gemm(R, Ce, Dp / 2, w.dob.pairs() + r0 * Dp / 2, Dp / 2, w.vt.pairs() + c0, Tp, w.ds.data(), kBlockCols, 1.f,
         false);
    score_grads_tile(ts, r0, R, c0, C, Ce, w.p.data(), w.ds.data(), w.z.data(), w.delta.data());
    // dKᵀ += qᵀ dS · scale; dQ += dS k (· scale at the end)
    pair_rows(w.ds.data(), kBlockCols, R, Ce, w.dsp.pairs(), kBlockCols);
    gemm(Dp, Ce, R2, w.qt.pairs() + r0 / 2, Tp / 2, w.dsp.pairs(), kBlockCols, w.dkt.data(), kBlockCols, ts.scale,
         true);
    rows_to_bf16(w.ds.data(), kBlockCols, R, Ce, w.dsr.data(), kBlockCols);
    gemm(R, Dp, Ce / 2, w.dsr.pairs(), kBlockCols / 2, w.kp.pairs() + (c0 / 2) * Dp, Dp, w.dqa.data() + r0 * Dp, Dp,
         1.f, true);
  }
}

}  // namespace

bool available() {
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
  const char* env = std::getenv("STRATA_ATTENTION_BF16");
  return cpu && !(env != nullptr && std::string(env) == "0");
}

void forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const TileShape& ts,
             torch::Tensor& out, torch::Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), T = ts.T;
  const HeadView qv = view_of(q), kv = view_of(k, H), vv = view_of(v, H);
  const int64_t Tp = round_up(T, kBlockCols);
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  // One task per batch·head, as the fp32 forward (attention.cpp says why).
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    ForwardScratch w(Tp, ts.Dp);
    for (int64_t bh = begin; bh < end; ++bh) {
      w.in.load(qv, kv, vv, bh, T, ts.D);
      pair_rows(w.in.v.data(), ts.Dp, Tp, ts.Dp, w.vp.pairs(), ts.Dp);
      float* out_rows = out_data + (bh / H) * out.stride(0) + (bh % H) * out.stride(1);
      for (int64_t r0 = 0; r0 < T; r0 += kBlockRows) {
        forward_row_tile(ts, bh, r0, w, out_rows, out.stride(2), lse_data + bh * T);
      }
    }
  });
}

void backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& grad_out,
              const torch::Tensor& out, const torch::Tensor& lse, const TileShape& ts, torch::Tensor& dq,
              torch::Tensor& dk, torch::Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), T = ts.T, D = ts.D, Dp = ts.Dp;
  // dk, dv per query head, as the fp32 backward.
  const HeadView qv = view_of(q), kv = view_of(k, H), vv = view_of(v, H), gv = view_of(grad_out), ov = view_of(out);
  const int64_t Tp = round_up(T, kBlockCols);
  const float* lse_data = lse.data_ptr<float>();
  const int64_t gsb = dq.stride(0), gsh = dq.stride(1), gst = dq.stride(2);
  float* dq_data = dq.data_ptr<float>();
  float* dk_data = dk.data_ptr<float>();
  float* dv_data = dv.data_ptr<float>();
  // One task per batch·head, as the fp32 backward (attention.cpp says why).
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch w(Tp, Dp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t head = (bh / H) * gsb + (bh % H) * gsh;
      load_backward_head(ts, bh, qv, kv, vv, gv, ov, w);
      for (int64_t c0 = 0; c0 < T; c0 += kBlockCols) {
        backward_column_tile(ts, bh, c0, lse_data + bh * T, w);
        for (int64_t c = 0; c < std::min(kBlockCols, T - c0); ++c) {
          const int64_t off = head + (c0 + c) * gst;
          for (int64_t d = 0; d < D; ++d) {
            dk_data[off + d] = w.dkt.data()[d * kBlockCols + c];
            dv_data[off + d] = w.dvt.data()[d * kBlockCols + c];
          }
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        float* o = dq_data + head + t * gst;
        for (int64_t d = 0; d < D; ++d) o[d] = w.dqa.data()[t * Dp + d] * ts.scale;
      }
    }
  });
}

#else  // !STRATA_HAVE_AVX512_BF16

bool available() { return false; }

void forward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const tiles::TileShape&,
             torch::Tensor&, torch::Tensor&) {
  TORCH_CHECK(false, "causal attention: this build has no AVX512-BF16 tiles (available() is false)");
}

void backward(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
              const torch::Tensor&, const torch::Tensor&, const tiles::TileShape&, torch::Tensor&, torch::Tensor&,
              torch::Tensor&) {
  TORCH_CHECK(false, "causal attention: this build has no AVX512-BF16 tiles (available() is false)");
}

#endif  // STRATA_HAVE_AVX512_BF16

}  // namespace strata::kernels::bf16
