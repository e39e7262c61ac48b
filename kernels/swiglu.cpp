#include "strata/kernels/swiglu.h"

#include "strata/kernels/attention_tiles.h"  // v8f and vexp: this file has attention.cpp's flags
#include "strata/kernels/float_dispatch.h"

#include <ATen/Parallel.h>

namespace strata::kernels {
namespace {

using tiles::kW;
using tiles::v8f;

/// 8 elements of `p` (fp32, bf16 or fp16) as fp32 lanes, and back.
template <class T>
v8f load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return tiles::load(p);
  } else {
    float f[kW];
    for (int i = 0; i < kW; ++i) f[i] = static_cast<float>(p[i]);
    return tiles::load(f);
  }
}

template <class T>
void store8(T* p, v8f v) {
  if constexpr (std::is_same_v<T, float>) {
    tiles::store(p, v);
  } else {
    float f[kW];
    tiles::store(f, v);
    for (int i = 0; i < kW; ++i) p[i] = static_cast<T>(f[i]);
  }
}

/// 1 / (1 + e^-g), 8 lanes.
v8f sigmoid8(v8f g) { return tiles::splat(1.f) / (tiles::splat(1.f) + tiles::vexp(-g)); }

/// Runs `body(begin, end)` over [0, n) in chunks that are multiples of 8
/// (the last one holds the tail), in parallel.
template <class Body>
void for_chunks(int64_t n, const Body& body) {
  // Why this grain: 16K elements (64 KiB of fp32 per stream) keep a task's
  // streams in L2 and leave enough tasks for every thread at the MLP's sizes.
  constexpr int64_t kGrain = 16384;
  at::parallel_for(0, (n + kGrain - 1) / kGrain, 1, [&](int64_t lo, int64_t hi) {
    body(lo * kGrain, std::min(n, hi * kGrain));
  });
}

template <class T>
void forward_loop(const T* g, const T* u, T* out, int64_t n) {
  for_chunks(n, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + kW <= end; i += kW) {
      const v8f gv = load8(g + i);
      store8(out + i, gv * sigmoid8(gv) * load8(u + i));
    }
    for (; i < end; ++i) {
      const float gi = static_cast<float>(g[i]);
      out[i] = static_cast<T>(gi / (1.f + std::exp(-gi)) * static_cast<float>(u[i]));
    }
  });
}

template <class T, class D>
void backward_loop(const D* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  const v8f one = tiles::splat(1.f);
  for_chunks(n, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + kW <= end; i += kW) {
      const v8f gv = load8(g + i), uv = load8(u + i), d = load8(dy + i), s = sigmoid8(gv);
      store8(dg + i, d * uv * s * (one + gv * (one - s)));
      store8(du + i, d * gv * s);
    }
    for (; i < end; ++i) {
      const float gi = static_cast<float>(g[i]), ui = static_cast<float>(u[i]), d = static_cast<float>(dy[i]);
      const float s = 1.f / (1.f + std::exp(-gi));
      dg[i] = static_cast<T>(d * ui * s * (1.f + gi * (1.f - s)));
      du[i] = static_cast<T>(d * gi * s);
    }
  });
}

void check(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "swiglu: gate and up must have one shape and dtype (got ", gate.sizes(), " ", gate.scalar_type(), ", ",
              up.sizes(), " ", up.scalar_type(), ")");
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu(), "swiglu: the fused kernel is CPU-only (got ",
              gate.device(), ")");
}

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_forward(gate, up);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dg, du] = swiglu_backward(grads[0], saved[0], saved[1]);
    return {dg, du};
  }
};

}  // namespace

torch::Tensor swiglu_forward(const torch::Tensor& gate_in, const torch::Tensor& up_in) {
  check(gate_in, up_in);
  const auto gate = gate_in.contiguous(), up = up_in.contiguous();
  auto out = torch::empty_like(gate);
  STRATA_DISPATCH_FLOAT_TYPES(gate.scalar_type(), "swiglu", [&] {
    forward_loop(gate.data_ptr<scalar_t>(), up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gate.numel());
  });
  return out;
}

std::pair<torch::Tensor, torch::Tensor> swiglu_backward(const torch::Tensor& grad_in, const torch::Tensor& gate_in,
                                                        const torch::Tensor& up_in) {
  check(gate_in, up_in);
  TORCH_CHECK(grad_in.sizes() == gate_in.sizes(), "swiglu backward: grad_out ", grad_in.sizes(), " must match gate ",
              gate_in.sizes());
  const auto gate = gate_in.contiguous(), up = up_in.contiguous();
  // The incoming gradient in fp32 or the inputs' dtype, as it comes.
  const auto grad = (grad_in.scalar_type() == at::kFloat ? grad_in : grad_in.to(gate.scalar_type())).contiguous();
  auto dg = torch::empty_like(gate), du = torch::empty_like(up);
  STRATA_DISPATCH_FLOAT_TYPES(gate.scalar_type(), "swiglu_backward", [&] {
    using T = scalar_t;
    if (grad.scalar_type() == at::kFloat) {
      backward_loop(grad.data_ptr<float>(), gate.data_ptr<T>(), up.data_ptr<T>(), dg.data_ptr<T>(), du.data_ptr<T>(),
                    gate.numel());
    } else {
      backward_loop(grad.data_ptr<T>(), gate.data_ptr<T>(), up.data_ptr<T>(), dg.data_ptr<T>(), du.data_ptr<T>(),
                    gate.numel());
    }
  });
  return {dg, du};
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!gate.device().is_cpu() || gate.scalar_type() != up.scalar_type() || gate.sizes() != up.sizes()) {
    return torch::silu(gate) * up;
  }
  return SwigluFunction::apply(gate, up);
}

}  // namespace strata::kernels
