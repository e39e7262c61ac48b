// swiglu_test - the fused SwiGLU (kernels/swiglu.h) against ATen's composite
// silu(gate) * up: outputs and both gradients, fp32, bf16 and fp16, lengths
// with and without an 8-wide tail, values far into both saturations; and what
// it saves for backward.
#include "strata/kernels/swiglu.h"

#include <gtest/gtest.h>

#include <string>

namespace {
namespace kernels = strata::kernels;

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

}  // namespace
