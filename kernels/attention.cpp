#include "strata/kernels/attention.h"

#include <ATen/record_function.h>

#include "strata/kernels/attention_steps.h"
#include "strata/kernels/attention_bf16.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

namespace strata::kernels {
namespace {

using namespace tiles;  // NOLINT: this file is the tiles' only user

/// One task's fp32 scratch for the forward of a head.
struct ForwardScratch {
  ForwardScratch(int64_t Tp, int64_t D, int64_t Dp)
      : qs(Tp * Dp), kt(D * Tp), vs(Tp * Dp), ks(Tp * Dp), s(kBlockRows * kBlockCols),
        acc(kBlockRows * Dp), m(kBlockRows), l(kBlockRows) {}
  Scratch qs, kt, vs, ks, s, acc, m, l;
};

/// Output rows [r0, r0 + R) of head bh (qs, kt, vs loaded): writes them to
/// `out_rows` (row t at out_rows + t·ost) and their logsumexp to lse_rows.
void forward_row_tile(const TileShape& ts, int64_t bh, int64_t r0, ForwardScratch& w, float* out_rows,
                      int64_t ost, float* lse_rows) {
  const int64_t R = std::min(kBlockRows, ts.T - r0), Dp = ts.Dp;
  std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.end(), 0.f);
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
  // Tiles entirely above the diagonal (c0 > last row) are never visited.
  for (int64_t c0 = 0; c0 < r0 + R; c0 += kBlockCols) {
    const int64_t C = std::min(kBlockCols, r0 + R - c0);
    const int64_t Cp = round_up(C, 2 * kW);
    gemm(R, Cp, ts.D, w.qs.data() + r0 * Dp, Dp, w.kt.data() + c0 * ts.D, kBlockCols, w.s.data(), kBlockCols,
         false);
    online_softmax_tile(ts, bh, r0, R, c0, C, w.s.data(), w.m.data(), w.l.data(), w.acc.data());
    gemm(R, Dp, Cp, w.s.data(), kBlockCols, w.vs.data() + c0 * Dp, Dp, w.acc.data(), Dp, true);
  }
  for (int64_t i = 0; i < R; ++i) {
    const int64_t row = r0 + i;
    const float inv = 1.f / w.l[i];
    float* o = out_rows + row * ost;
    const float* ai = w.acc.data() + i * Dp;
    for (int64_t d = 0; d < ts.D; ++d) o[d] = ai[d] * inv;
    lse_rows[row] = w.m[i] + std::log(w.l[i]);
  }
}

/// One task's fp32 scratch for the backward of a head.
struct BackwardScratch {
  BackwardScratch(int64_t Tp, int64_t D, int64_t Dp)
      : qs(Tp * Dp), ks(Tp * Dp), kt(D * Tp), vs(Tp * Dp), vt(D * Tp), dos(Tp * Dp), os(Tp * Dp),
        dqa(Tp * Dp), delta(Tp), p(kBlockRows * kBlockCols), ds(kBlockRows * kBlockCols),
        pd(kBlockRows * kBlockCols), dkv(kBlockCols * Dp), dva(kBlockCols * Dp), z(kBlockRows * kBlockCols) {}
  Scratch qs, ks, kt, vs, vt, dos, os, dqa, delta, p, ds, pd, dkv, dva;
  std::vector<uint8_t> z;  ///< the dropout keep mask of a tile
};

/// Key/value columns [c0, c0 + C) of head bh: accumulates their dK, dV in
/// w.dkv, w.dva over the row tiles that see them, and dQ of those rows in w.dqa.
void backward_column_tile(const TileShape& ts, int64_t bh, int64_t c0, const float* lse_row, BackwardScratch& w) {
  const int64_t C = std::min(kBlockCols, ts.T - c0), Dp = ts.Dp, D = ts.D;
  std::fill(w.dkv.begin(), w.dkv.end(), 0.f);
  std::fill(w.dva.begin(), w.dva.end(), 0.f);
  // Only row tiles reaching the diagonal: rows < c0 see none of these columns.
  for (int64_t r0 = c0 / kBlockRows * kBlockRows; r0 < ts.T; r0 += kBlockRows) {
    const int64_t R = std::min(kBlockRows, ts.T - r0);
    // Columns some row of this tile sees: on the diagonal fewer than C.
    const int64_t Ce = round_up(std::min(C, r0 + R - c0), 2 * kW);
    gemm(R, Ce, D, w.qs.data() + r0 * Dp, Dp, w.kt.data() + c0 * D, kBlockCols, w.p.data(), kBlockCols, false);
    recompute_probs_tile(ts, bh, r0, R, c0, C, Ce, lse_row, w.p.data(), w.pd.data(), w.z.data());
    // dV += (dropped P)ᵀ dO
    gemm_tn(Ce, Dp, R, ts.dropout ? w.pd.data() : w.p.data(), kBlockCols, w.dos.data() + r0 * Dp, Dp,
            w.dva.data(), Dp, true);
    // dP (of the dropped P) = dO Vᵀ
    gemm(R, Ce, D, w.dos.data() + r0 * Dp, Dp, w.vt.data() + c0 * D, kBlockCols, w.ds.data(), kBlockCols, false);
    score_grads_tile(ts, r0, R, c0, C, Ce, w.p.data(), w.ds.data(), w.z.data(), w.delta.data());
    // dK += dSᵀ (q·scale); dQ += dS K (times scale at the end)
    gemm_tn(Ce, Dp, R, w.ds.data(), kBlockCols, w.qs.data() + r0 * Dp, Dp, w.dkv.data(), Dp, true);
    gemm(R, Dp, Ce, w.ds.data(), kBlockCols, w.ks.data() + c0 * Dp, Dp, w.dqa.data() + r0 * Dp, Dp, true);
  }
}

/// The views the backward reads, per head.
struct BackwardInputs {
  HeadView q, k, v, grad_out, out;
};

/// Head bh's q·scale, k, v (and their tile transposes), dO and O into w, and
/// delta_t = rowsum(dO ∘ O) = rowsum(P ∘ dP), dropout included.
void load_backward_head(const TileShape& ts, int64_t bh, const BackwardInputs& in, BackwardScratch& w) {
  const int64_t T = ts.T, D = ts.D, Dp = ts.Dp;
  in.q.rows_to(bh, T, D, ts.scale, w.qs.data(), Dp);
  in.k.rows_to(bh, T, D, 1.f, w.ks.data(), Dp);
  transpose_blocked(T, D, w.ks.data(), Dp, w.kt.data());
  in.v.rows_to(bh, T, D, 1.f, w.vs.data(), Dp);
  transpose_blocked(T, D, w.vs.data(), Dp, w.vt.data());
  in.grad_out.rows_to(bh, T, D, 1.f, w.dos.data(), Dp);
  in.out.rows_to(bh, T, D, 1.f, w.os.data(), Dp);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.f;
    for (int64_t d = 0; d < D; ++d) sum += w.dos[t * Dp + d] * w.os[t * Dp + d];
    w.delta[t] = sum;
  }
  std::fill(w.dqa.begin(), w.dqa.end(), 0.f);
}

/// dO and O may come in another dtype than q (the fp32 output of bf16 inputs,
/// fp32 gradients of a bf16 output): fp32, bf16 and fp16 are read as they are.
torch::Tensor readable(const torch::Tensor& t) {
  const bool ok = t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  return rows_contiguous(ok ? t : t.to(at::kFloat));
}

/// The fp32 tiles' forward of every head (bf16::forward's counterpart).
void forward_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const TileShape& ts,
                   torch::Tensor& out, torch::Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), T = ts.T, D = ts.D;
  const HeadView qv = view_of(q), kv = view_of(k, H), vv = view_of(v, H);
  const int64_t Tp = round_up(T, kBlockCols);
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  // Why one task per batch·head: K and V of a head are converted once into
  // fp32 scratch shared by all its row tiles, and tasks never write the same
  // output rows (no synchronisation inside the kernel).
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    ForwardScratch w(Tp, D, ts.Dp);
    for (int64_t bh = begin; bh < end; ++bh) {
      qv.rows_to(bh, T, D, ts.scale, w.qs.data(), ts.Dp);  // scaled once: S = (q·scale) kᵀ
      kv.rows_to(bh, T, D, 1.f, w.ks.data(), ts.Dp);
      transpose_blocked(T, D, w.ks.data(), ts.Dp, w.kt.data());
      vv.rows_to(bh, T, D, 1.f, w.vs.data(), ts.Dp);
      float* out_rows = out_data + (bh / H) * out.stride(0) + (bh % H) * out.stride(1);
      for (int64_t r0 = 0; r0 < T; r0 += kBlockRows) {
        forward_row_tile(ts, bh, r0, w, out_rows, out.stride(2), lse_data + bh * T);
      }
    }
  });
}

/// The fp32 tiles' backward of every head (bf16::backward's counterpart).
void backward_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const torch::Tensor& grad_out, const torch::Tensor& out, const torch::Tensor& lse,
                    const TileShape& ts, torch::Tensor& dq, torch::Tensor& dk, torch::Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), T = ts.T, D = ts.D;
  // out: fp32 or q's dtype
  // dk, dv: per query head (the caller sums each kv head's group).
  const BackwardInputs in{view_of(q), view_of(k, H), view_of(v, H), view_of(grad_out), view_of(out)};
  const int64_t Tp = round_up(T, kBlockCols), Dp = ts.Dp;
  const float* lse_data = lse.data_ptr<float>();
  const int64_t gsb = dq.stride(0), gsh = dq.stride(1), gst = dq.stride(2);
  float* dq_data = dq.data_ptr<float>();
  float* dk_data = dk.data_ptr<float>();
  float* dv_data = dv.data_ptr<float>();

  // Why one task per batch·head: dK/dV of a column tile sum over row tiles
  // and dQ of a row tile over column tiles; within one head a single task
  // does both, so no two tasks ever add into the same gradient rows.
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    BackwardScratch w(Tp, D, Dp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t head = (bh / H) * gsb + (bh % H) * gsh;
      load_backward_head(ts, bh, in, w);
      for (int64_t c0 = 0; c0 < T; c0 += kBlockCols) {
        backward_column_tile(ts, bh, c0, lse_data + bh * T, w);
        for (int64_t c = 0; c < std::min(kBlockCols, T - c0); ++c) {
          const int64_t off = head + (c0 + c) * gst;
          std::memcpy(dk_data + off, w.dkv.data() + c * Dp, D * sizeof(float));
          std::memcpy(dv_data + off, w.dva.data() + c * Dp, D * sizeof(float));
        }
      }
      for (int64_t t = 0; t < T; ++t) {
        float* o = dq_data + head + t * gst;
        for (int64_t d = 0; d < D; ++d) o[d] = w.dqa[t * Dp + d] * ts.scale;
      }
    }
  });
}

}  // namespace

AttentionForward causal_attention_forward(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                          const torch::Tensor& v_in, double dropout_p,
                                          uint64_t seed) {
  RECORD_FUNCTION("strata::causal_attention_forward", std::vector<c10::IValue>());  // a span in --profile traces
  check_inputs(q_in, k_in, v_in, dropout_p);
  const auto q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  auto out = empty_bthd(B, H, T, D);
  auto lse = torch::empty({B, H, T}, torch::kFloat32);
  if (q.numel() == 0) return {out.to(q.scalar_type()), lse, out};
  const TileShape ts(T, D, dropout_p, seed);
  if (q.scalar_type() == at::kBFloat16 && bf16::available()) {
    bf16::forward(q, k, v, ts, out, lse);  // bf16 products at twice fp32's rate (attention_bf16.h)
  } else {
    forward_heads(q, k, v, ts, out, lse);
  }
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
  const auto grad_out = readable(grad_out_in), out = readable(out_in);
  const auto lse_c = lse.to(torch::kFloat32).contiguous();
  TORCH_CHECK(lse_c.numel() == B * H * T, "causal attention backward: lse has ", lse_c.numel(),
              " elements, expected B·H·T = ", B * H * T);
  // dk, dv per query head; with grouped queries each kv head's group is
  // summed below (a transient [B, H, T, D] pair, in backward only).
  auto dq = empty_bthd(B, H, T, D), dk = empty_bthd(B, H, T, D), dv = empty_bthd(B, H, T, D);
  if (q.numel() > 0) {
    const TileShape ts(T, D, dropout_p, seed);
    if (q.scalar_type() == at::kBFloat16 && bf16::available()) {
      bf16::backward(q, k, v, grad_out, out, lse_c, ts, dq, dk, dv);
    } else {
      backward_heads(q, k, v, grad_out, out, lse_c, ts, dq, dk, dv);
    }
  }
  if (const int64_t kv_heads = k.size(1); kv_heads < H) {
    dk = dk.view({B, kv_heads, H / kv_heads, T, D}).sum(2);
    dv = dv.view({B, kv_heads, H / kv_heads, T, D}).sum(2);
  }
  const auto dtype = q.scalar_type();
  if (dtype == at::kFloat) return {dq, dk, dv};
  return {dq.to(dtype), dk.to(dtype), dv.to(dtype)};
}

namespace {

/// The backward both autograd nodes share: from q, k, v, the fp32 output and
/// the logsumexp saved in that order, and the dropout probability and seed
/// from which it regenerates the mask.
torch::autograd::variable_list attention_backward(torch::autograd::AutogradContext* ctx,
                                                  const torch::autograd::variable_list& grads) {
  const auto saved = ctx->get_saved_variables();
  auto g = causal_attention_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
                                     ctx->saved_data["dropout_p"].toDouble(),
                                     static_cast<uint64_t>(ctx->saved_data["seed"].toInt()));
  return {g.dq, g.dk, g.dv};
}

void save_for_attention_backward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                                 const torch::Tensor& k, const torch::Tensor& v, const AttentionForward& f,
                                 double dropout_p, int64_t seed) {
  // The fp32 output (for bf16 inputs a second, fp32 copy: B·T·C floats).
  ctx->save_for_backward({q, k, v, f.out_fp32, f.lse});
  ctx->saved_data["dropout_p"] = dropout_p;
  ctx->saved_data["seed"] = seed;
}

/// The autograd node: runs the forward kernel.
class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, double dropout_p,
                               int64_t seed) {
    auto result = causal_attention_forward(q, k, v, dropout_p, static_cast<uint64_t>(seed));
    save_for_attention_backward(ctx, q, k, v, result, dropout_p, seed);
    return result.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto g = attention_backward(ctx, grads);
    g.insert(g.end(), {torch::Tensor(), torch::Tensor()});
    return g;
  }
};

/// The autograd node over a forward already run (causal_attention_from).
class KeptAttentionFunction : public torch::autograd::Function<KeptAttentionFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& out,
                               const torch::Tensor& lse, const torch::Tensor& out_fp32, double dropout_p,
                               int64_t seed) {
    save_for_attention_backward(ctx, q, k, v, {out, lse, out_fp32}, dropout_p, seed);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto g = attention_backward(ctx, grads);
    g.insert(g.end(), 5, torch::Tensor());
    return g;
  }
};

}  // namespace

bool bf16_products_available() { return bf16::available(); }

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

torch::Tensor causal_attention_from(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const AttentionForward& forward, double dropout_p, uint64_t seed) {
  TORCH_CHECK(forward.out.defined() && forward.lse.defined() && forward.out_fp32.defined(),
              "causal_attention_from: the forward's out, lse and out_fp32 must all be given");
  TORCH_CHECK(forward.out.sizes() == q.sizes() && forward.lse.numel() == q.numel() / q.size(-1),
              "causal_attention_from: a forward of shape ", forward.out.sizes(), " (lse ", forward.lse.sizes(),
              ") does not fit q ", q.sizes());
  return KeptAttentionFunction::apply(q, k, v, forward.out, forward.lse, forward.out_fp32, dropout_p,
                                      static_cast<int64_t>(seed));
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
