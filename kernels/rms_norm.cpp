#include "strata/kernels/rms_norm.h"

#include "strata/kernels/attention_tiles.h"  // v8f: this file has attention.cpp's flags
#include "strata/kernels/float_dispatch.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace strata::kernels {
namespace {

using tiles::kW;
using tiles::v8f;

float hsum(v8f v) {
  float f[kW];
  tiles::store(f, v);
  return ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
}

/// Σ a·b over [0, n), 8 lanes then the tail.
float dot(const float* a, const float* b, int64_t n) {
  v8f acc = tiles::splat(0.f);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) acc += tiles::load(a + i) * tiles::load(b + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// Rows per task: about 16K elements, so a task's rows stay in L2.
int64_t grain(int64_t C) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, C)); }

/// x rounded as `weight * normed.to(x.dtype)` rounds the normalised value.
template <class T>
float as_x(float n) {
  if constexpr (std::is_same_v<T, float>) {
    return n;
  } else {
    return static_cast<float>(static_cast<T>(n));
  }
}

template <class T, class O>
void forward_rows(const T* x, const float* w, O* y, float* rstd, int64_t rows, int64_t C, float eps) {
  at::parallel_for(0, rows, grain(C), [&](int64_t lo, int64_t hi) {
    std::vector<float> row(C);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * C;
      for (int64_t c = 0; c < C; ++c) row[c] = static_cast<float>(xr[c]);
      const float rs = 1.f / std::sqrt(dot(row.data(), row.data(), C) / static_cast<float>(C) + eps);
      rstd[r] = rs;
      O* yr = y + r * C;
      for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<O>(as_x<T>(row[c] * rs) * w[c]);
    }
  });
}

template <class T, class G>
void backward_rows(const G* dy, const T* x, const float* w, const float* rstd, T* dx, float* dw_parts,
                   int64_t rows, int64_t C) {
  at::parallel_for(0, rows, grain(C), [&](int64_t lo, int64_t hi) {
    // This thread's share of the weight's gradient (summed by the caller).
    float* dw = dw_parts != nullptr ? dw_parts + at::get_thread_num() * C : nullptr;
    std::vector<float> n(C), dn(C);
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * C;
      const G* dyr = dy + r * C;
      const float rs = rstd[r];
      for (int64_t c = 0; c < C; ++c) {
        n[c] = static_cast<float>(xr[c]) * rs;
        const float g = static_cast<float>(dyr[c]);
        dn[c] = g * w[c];
        if (dw != nullptr) dw[c] += g * as_x<T>(n[c]);
      }
      // dx = rstd · (dn - n · mean(dn · n))
      const float mean = dot(dn.data(), n.data(), C) / static_cast<float>(C);
      T* dxr = dx + r * C;
      for (int64_t c = 0; c < C; ++c) dxr[c] = static_cast<T>(rs * (dn[c] - n[c] * mean));
    }
  });
}

void check(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1), "rms_norm: weight ", weight.sizes(),
              " must be [C] for x ", x.sizes(), " normalised over its last dim");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: the fused kernel is CPU-only (got ",
              x.device(), ")");
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    auto [y, rstd] = rms_norm_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = rms_norm_backward(grads[0], saved[0], saved[1], saved[2], ctx->needs_input_grad(1));
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> rms_norm_forward(const torch::Tensor& x_in, const torch::Tensor& weight,
                                                          double eps) {
  check(x_in, weight);
  const auto x = x_in.contiguous();
  const auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  auto y = torch::empty(x.sizes(), x.options().dtype(at::promote_types(x.scalar_type(), weight.scalar_type())));
  auto rstd = torch::empty({rows}, x.options().dtype(torch::kFloat32));
  STRATA_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rms_norm", [&] {
    using T = scalar_t;
    STRATA_DISPATCH_FLOAT_TYPES(y.scalar_type(), "rms_norm", [&] {
      using O = scalar_t;
      forward_rows(x.data_ptr<T>(), w.data_ptr<float>(), y.data_ptr<O>(), rstd.data_ptr<float>(), rows, C,
                   static_cast<float>(eps));
    });
  });
  return {y, rstd};
}

std::tuple<torch::Tensor, torch::Tensor> rms_norm_backward(const torch::Tensor& grad_in, const torch::Tensor& x_in,
                                                           const torch::Tensor& weight, const torch::Tensor& rstd,
                                                           bool weight_grad) {
  check(x_in, weight);
  TORCH_CHECK(grad_in.sizes() == x_in.sizes(), "rms_norm backward: grad_out ", grad_in.sizes(), " must match x ",
              x_in.sizes());
  const auto x = x_in.contiguous(), grad = grad_in.contiguous();
  const auto w = weight.to(torch::kFloat32).contiguous();
  const int64_t C = x.size(-1), rows = C > 0 ? x.numel() / C : 0;
  auto dx = torch::empty_like(x);
  // One row of partial sums per thread for the weight's gradient.
  torch::Tensor parts = weight_grad ? torch::zeros({at::get_num_threads(), C}, torch::kFloat32) : torch::Tensor();
  STRATA_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rms_norm_backward", [&] {
    using T = scalar_t;
    STRATA_DISPATCH_FLOAT_TYPES(grad.scalar_type(), "rms_norm_backward", [&] {
      using G = scalar_t;
      backward_rows(grad.data_ptr<G>(), x.data_ptr<T>(), w.data_ptr<float>(), rstd.data_ptr<float>(),
                    dx.data_ptr<T>(), weight_grad ? parts.data_ptr<float>() : nullptr, rows, C);
    });
  });
  torch::Tensor dw;
  if (weight_grad) dw = parts.sum(0).to(weight.scalar_type());
  return {dx, dw};
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace strata::kernels
