// elementwise_test - the Llama family's fused CPU kernels against the
// composites they replace, through autograd, in fp32, bf16 and fp16 (mixed
// dtypes where the model mixes them), with widths with and without an 8-wide
// tail; each with a control a wrong kernel would fail:
// - SwiGLU (kernels/swiglu.h): silu(gate) * up, values far into both
//   saturations, and what it saves for backward;
// - RMSNorm (kernels/rms_norm.h): transformers' x in fp32 · rsqrt(mean(x²) +
//   eps), cast to x's dtype, times the weight; a frozen weight gets no gradient;
// - RoPE (kernels/rope.h): x · cos + rotate_half(x) · sin on a transposed
//   [B, T, H, D] projection as the Llama makes it; the control is the
//   interleaved-pair layout of Meta's checkpoints.
#include "strata/kernels/rms_norm.h"
#include "strata/kernels/rope.h"
#include "strata/kernels/swiglu.h"
#include "strata/recipes/models/llama/llama.h"

#include <gtest/gtest.h>

#include <string>

namespace {
namespace kernels = strata::kernels;

/// Largest absolute difference relative to the largest magnitude of `b`.
double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a32 = a.to(torch::kFloat32), b32 = b.to(torch::kFloat32);
  return (a32 - b32).abs().max().item<double>() / std::max(1e-30, b32.abs().max().item<double>());
}

TEST(SwigluTest, MatchesSiluTimesUpForwardAndBackward) {
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
    for (const int64_t n : {1, 7, 8, 1000, 70001}) {
      const std::string what = std::string(c10::toString(dtype)) + " n" + std::to_string(n);
      torch::manual_seed(n);
      // Scaled so that some gates saturate both ways (sigmoid ~0 and ~1).
      const auto g0 = (torch::randn({n}) * 6).to(dtype), u0 = torch::randn({n}).to(dtype);
      const auto dy = torch::randn({n}).to(dtype);
      auto g = g0.clone().requires_grad_(), u = u0.clone().requires_grad_();
      auto out = kernels::swiglu(g, u);
      out.backward(dy);
      auto gr = g0.to(torch::kFloat32).requires_grad_(), ur = u0.to(torch::kFloat32).requires_grad_();
      auto want = torch::silu(gr) * ur;
      want.backward(dy.to(torch::kFloat32));
      const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-2;
      EXPECT_EQ(out.scalar_type(), dtype) << what;
      EXPECT_LT(rel(out, want), tol) << what << " output";
      EXPECT_LT(rel(g.grad(), gr.grad()), tol) << what << " d gate";
      EXPECT_LT(rel(u.grad(), ur.grad()), tol) << what << " d up";
    }
  }
}

TEST(SwigluTest, FusedAndCompositeDifferOnlyInRounding) {
  // The control: a sign slip in the gate's derivative (1 - g(1 - s)) is far
  // outside the tolerance above.
  torch::manual_seed(3);
  const auto g = torch::randn({4096}) * 3, u = torch::randn({4096}), dy = torch::randn({4096});
  const auto [dg, du] = kernels::swiglu_backward(dy, g, u);
  const auto s = torch::sigmoid(g);
  EXPECT_LT(rel(dg, dy * u * s * (1 + g * (1 - s))), 1e-6);
  EXPECT_GT(rel(dg, dy * u * s * (1 - g * (1 - s))), 1e-2);
  EXPECT_THROW(kernels::swiglu_forward(g, u.to(torch::kFloat64)), c10::Error);
}

TEST(ElementwiseKernelsTest, ADtypeOutsideTheThreeFloatsIsRefusedNamingTheKernel) {
  const auto x = torch::randn({2, 8}, torch::kFloat64), w = torch::ones({8}, torch::kFloat64);
  const auto refused = [](const auto& call, const std::string& kernel) {
    try {
      call();
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      return what.find(kernel) != std::string::npos && what.find("Double") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused([&] { kernels::swiglu_forward(x, x); }, "swiglu"));
  EXPECT_TRUE(refused([&] { kernels::rms_norm_forward(x, w, 1e-5); }, "rms_norm"));
  EXPECT_TRUE(refused([&] { kernels::rope(x.view({1, 1, 2, 8}), torch::ones({2, 8}), torch::ones({2, 8})); }, "rope"));
}

TEST(RmsNormTest, MatchesTheCompositeForwardAndBackward) {
  struct Case {
    torch::Dtype x, w;
  };
  for (const auto& dt : {Case{torch::kFloat32, torch::kFloat32}, Case{torch::kBFloat16, torch::kBFloat16},
                         Case{torch::kFloat32, torch::kBFloat16}, Case{torch::kBFloat16, torch::kFloat32}}) {
    for (const int64_t C : {3, 7, 64, 200}) {  // (C = 1: dx cancels to rounding noise)
      const std::string what = std::string(c10::toString(dt.x)) + "/" + c10::toString(dt.w) + " C" + std::to_string(C);
      torch::manual_seed(C);
      const auto x0 = (torch::randn({3, 5, C}) * 3).to(dt.x), w0 = (torch::randn({C}) + 1).to(dt.w);
      auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      auto y = kernels::rms_norm(x, w, 1e-5);
      auto xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
      auto want = strata::recipes::rms_norm_composite(xr, wr, 1e-5);
      const auto dy = torch::randn(want.sizes()).to(want.scalar_type());
      y.backward(dy);
      want.backward(dy);
      EXPECT_EQ(y.scalar_type(), want.scalar_type()) << what;
      const double tol = dt.x == torch::kFloat32 && dt.w == torch::kFloat32 ? 1e-5 : 2e-2;
      EXPECT_LT(rel(y, want), tol) << what << " output";
      EXPECT_LT(rel(x.grad(), xr.grad()), tol) << what << " dx";
      EXPECT_LT(rel(w.grad(), wr.grad()), tol) << what << " dweight";
    }
  }
}

TEST(RmsNormTest, AFrozenWeightGetsNoGradientAndAWrongRstdIsSeen) {
  torch::manual_seed(1);
  const auto x0 = torch::randn({4, 16});
  auto x = x0.clone().requires_grad_();
  const auto w = torch::ones({16});  // frozen (LoRA's base)
  kernels::rms_norm(x, w, 1e-6).sum().backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  // The control: the backward from a wrong rstd (the RMS itself, not its
  // reciprocal) is far from the right one.
  const auto [y, rstd] = kernels::rms_norm_forward(x0, w, 1e-6);
  const auto dy = torch::randn({4, 16});
  const auto right = std::get<0>(kernels::rms_norm_backward(dy, x0, w, rstd, false));
  const auto wrong = std::get<0>(kernels::rms_norm_backward(dy, x0, w, 1 / rstd, false));
  EXPECT_GT(rel(wrong, right), 1e-1);
}

torch::Tensor rope_composite(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(3) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

TEST(RopeTest, MatchesTheCompositeForwardAndBackward) {
  const int64_t B = 2, T = 13, H = 3;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t D : {2, 16, 40}) {
      const std::string what = std::string(c10::toString(dtype)) + " D" + std::to_string(D);
      torch::manual_seed(D);
      const auto angles = torch::rand({T, D}) * 6;
      const auto cos = angles.cos(), sin = angles.sin();
      // A projection's [B, T, H, D] seen as [B, H, T, D], as the Llama's q.
      const auto base = torch::randn({B, T, H, D}).to(dtype);
      auto x = base.clone().transpose(1, 2).requires_grad_();
      auto xr = base.clone().transpose(1, 2).requires_grad_();
      auto y = kernels::rope(x, cos, sin);
      auto want = rope_composite(xr, cos, sin);
      const auto dy = torch::randn({B, H, T, D}).to(dtype);
      y.backward(dy);
      want.backward(dy);
      const double tol = dtype == torch::kFloat32 ? 1e-6 : 1e-2;
      EXPECT_EQ(y.strides(), x.strides()) << what << ": the output keeps x's layout";
      EXPECT_LT(rel(y, want), tol) << what << " output";
      EXPECT_LT(rel(x.grad(), xr.grad()), tol) << what << " dx";
    }
  }
}

TEST(RopeTest, InterleavedPairsAreAnotherRotation) {
  // The control: the same rotation applied to interleaved pairs (0, 1), (2,
  // 3), ... instead of halves (0, D/2), ... gives another result.
  torch::manual_seed(1);
  const int64_t D = 8;
  const auto angles = torch::rand({5, D}) * 6;
  const auto x = torch::randn({1, 2, 5, D});
  auto perm = torch::stack({torch::arange(D / 2), torch::arange(D / 2) + D / 2}, 1).reshape({-1});
  const auto interleaved = kernels::rope(x.index_select(3, perm), angles.cos(), angles.sin());
  EXPECT_GT(rel(interleaved.index_select(3, torch::argsort(perm)), kernels::rope(x, angles.cos(), angles.sin())), 1e-2);
}

}  // namespace
