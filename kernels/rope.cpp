#include "strata/kernels/rope.h"

#include "strata/kernels/float_dispatch.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace strata::kernels {
namespace {

/// One row of D elements: out = x · c + rotate_half(x) · s, or with
/// `inverse` its transpose, dx = dy · c + rotate_half⁻¹(dy · s) with
/// rotate_half⁻¹(z) = (z[D/2:], -z[:D/2]).
template <class T>
void rotate_row(const T* x, const float* c, const float* s, T* out, int64_t D, bool inverse, float* a, float* b) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    a[i] = static_cast<float>(x[i]);
    b[i] = static_cast<float>(x[i + half]);
  }
  if (!inverse) {
    for (int64_t i = 0; i < half; ++i) {
      out[i] = static_cast<T>(a[i] * c[i] - b[i] * s[i]);
      out[i + half] = static_cast<T>(b[i] * c[i + half] + a[i] * s[i + half]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      out[i] = static_cast<T>(a[i] * c[i] + b[i] * s[i + half]);
      out[i + half] = static_cast<T>(b[i] * c[i + half] - a[i] * s[i]);
    }
  }
}

template <class T>
void rotate_all(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& out,
                bool inverse) {
  const int64_t B = x.size(0), H = x.size(1), T_ = x.size(2), D = x.size(3);
  const int64_t xb = x.stride(0), xh = x.stride(1), xt = x.stride(2);
  const int64_t ob = out.stride(0), oh = out.stride(1), ot = out.stride(2);
  const T* xd = x.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const float* cd = cos.data_ptr<float>();
  const float* sd = sin.data_ptr<float>();
  // Rows in (b, t, h) order: a transposed projection's memory order.
  at::parallel_for(0, B * T_ * H, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)), [&](int64_t lo, int64_t hi) {
    std::vector<float> a(D / 2), b(D / 2);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t h = r % H, t = (r / H) % T_, bi = r / (H * T_);
      rotate_row(xd + bi * xb + h * xh + t * xt, cd + t * D, sd + t * D, od + bi * ob + h * oh + t * ot, D, inverse,
                 a.data(), b.data());
    }
  });
}

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_apply(x, cos, sin, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rope_apply(grads[0], saved[0], saved[1], true), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rope_apply(const torch::Tensor& x_in, const torch::Tensor& cos_in, const torch::Tensor& sin_in,
                         bool inverse) {
  TORCH_CHECK(x_in.dim() == 4 && x_in.size(3) % 2 == 0, "rope: x must be [B, H, T, D] with D even (got ",
              x_in.sizes(), ")");
  TORCH_CHECK(cos_in.sizes() == sin_in.sizes() && cos_in.dim() == 2 && cos_in.size(0) == x_in.size(2) &&
                  cos_in.size(1) == x_in.size(3),
              "rope: cos and sin must be [T, D] for x ", x_in.sizes(), " (got ", cos_in.sizes(), ", ", sin_in.sizes(),
              ")");
  TORCH_CHECK(x_in.device().is_cpu(), "rope: the fused kernel is CPU-only (got ", x_in.device(), ")");
  const auto x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const auto cos = cos_in.to(torch::kFloat32).contiguous(), sin = sin_in.to(torch::kFloat32).contiguous();
  auto out = torch::empty_like(x);  // x's layout (dense: empty_like keeps permuted strides)
  TORCH_CHECK(out.stride(3) == 1, "rope: the output's last dim must be contiguous");
  STRATA_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rope", [&] { rotate_all<scalar_t>(x, cos, sin, out, inverse); });
  return out;
}

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return RopeFunction::apply(x, cos, sin);
}

}  // namespace strata::kernels
