#pragma once
// The element-wise steps of kernels/attention.cpp's tiled causal attention,
// shared by its fp32 tiles and the AVX512-BF16 ones (attention_bf16.cpp):
// the online softmax of a forward score tile, the backward's recomputed
// probabilities and its score gradients.
//
// Include from those two files only: both are compiled with the same flags
// (kernels/CMakeLists.txt), which these inline functions must not meet others
// with in another translation unit (attention_tiles.h says why).
#include "strata/kernels/attention_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace strata::kernels::tiles {

/// What every tile of one call shares: sizes, the softmax scale and dropout.
struct TileShape {
  int64_t T, D;
  int64_t Dp;  ///< D padded for the GEMM's 16-column steps
  float scale;
  bool dropout;
  uint32_t threshold;
  float keep_scale;
  uint64_t seed;

  TileShape(int64_t t, int64_t d, double dropout_p, uint64_t s)
      : T(t), D(d), Dp(round_up(d, 2 * kW)), scale(1.0f / std::sqrt(static_cast<float>(d))),
        dropout(dropout_p > 0.0), threshold(keep_threshold(dropout_p)),
        keep_scale(static_cast<float>(1.0 / (1.0 - dropout_p))), seed(s) {}
};

/// Forward, one R-row score tile s at (r0, c0) with C columns (Cp padded):
/// exponentiates it under the rows' running max m, updates the normalisers l
/// and rescales the accumulated output rows acc (the online softmax).
inline void online_softmax_tile(const TileShape& ts, int64_t bh, int64_t r0, int64_t R, int64_t c0, int64_t C,
                         float* s, float* m, float* l, float* acc) {
  const int64_t Cp = round_up(C, 2 * kW);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = r0 + i;
    float* si = s + i * kBlockCols;
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
    if (ts.dropout) {
      const uint64_t key = row_key(ts.seed, bh, row);
      for (c = 0; c < valid; ++c) si[c] = keep(key, c0 + c, ts.threshold) ? si[c] * ts.keep_scale : 0.f;
    }
    float* ai = acc + i * ts.Dp;
    const v8f va = splat(alpha);
    for (int64_t d = 0; d < ts.Dp; d += kW) store(ai + d, load(ai + d) * va);
  }
}

/// Backward, tile (r0, c0): the scores in p ([R, kBlockCols]) become P
/// (recomputed from the logsumexp, 0 outside the causal columns), with
/// dropout also the keep mask z and the dropped-out P in pd. Ce: columns any
/// row of the tile sees.
inline void recompute_probs_tile(const TileShape& ts, int64_t bh, int64_t r0, int64_t R, int64_t c0, int64_t C,
                                 int64_t Ce, const float* lse_row, float* p, float* pd, uint8_t* z) {
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = r0 + i;
    float* pi = p + i * kBlockCols;
    const int64_t valid = std::max<int64_t>(0, std::min(C, row + 1 - c0));
    const v8f vl = splat(lse_row[row]);
    for (int64_t c = 0; c < Ce; c += kW) store(pi + c, vexp(load(pi + c) - vl));
    std::fill(pi + valid, pi + Ce, 0.f);
    if (!ts.dropout) continue;
    uint8_t* zi = z + i * kBlockCols;
    const uint64_t key = row_key(ts.seed, bh, row);
    for (int64_t c = 0; c < valid; ++c) zi[c] = keep(key, c0 + c, ts.threshold);
    float* pdi = pd + i * kBlockCols;  // the dropped-out P
    for (int64_t c = 0; c < Ce; ++c) pdi[c] = c < valid && zi[c] ? pi[c] * ts.keep_scale : 0.f;
  }
}

/// ds holds dP of the dropped P for tile (r0, c0); makes it dS = P ∘ (dP − delta).
inline void score_grads_tile(const TileShape& ts, int64_t r0, int64_t R, int64_t c0, int64_t C, int64_t Ce,
                             const float* p, float* ds, const uint8_t* z, const float* delta) {
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = r0 + i;
    const float* pi = p + i * kBlockCols;
    float* dsi = ds + i * kBlockCols;
    const uint8_t* zi = z + i * kBlockCols;
    const int64_t valid = std::max<int64_t>(0, std::min(C, row + 1 - c0));
    if (ts.dropout) {
      for (int64_t c = 0; c < valid; ++c) dsi[c] = zi[c] ? dsi[c] * ts.keep_scale : 0.f;
    }
    // dS = P ∘ (dP - delta); P is 0 outside the valid columns.
    const v8f vd = splat(delta[row]);
    for (int64_t c = 0; c < Ce; c += kW) store(dsi + c, load(pi + c) * (load(dsi + c) - vd));
  }
}

}  // namespace strata::kernels::tiles
