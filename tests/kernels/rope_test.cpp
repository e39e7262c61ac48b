// rope_test - the fused rotary embedding (kernels/rope.h) against the
// composite x · cos + rotate_half(x) · sin through autograd: output and dx,
// fp32 and bf16, on a transposed [B, T, H, D] projection as the Llama makes
// it; and a control (the interleaved-pair layout of Meta's checkpoints).
#include "strata/kernels/rope.h"

#include <gtest/gtest.h>

#include <string>

namespace {
namespace kernels = strata::kernels;

torch::Tensor composite(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto half = x.size(3) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a32 = a.to(torch::kFloat32), b32 = b.to(torch::kFloat32);
  return (a32 - b32).abs().max().item<double>() / b32.abs().max().item<double>();
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
      auto want = composite(xr, cos, sin);
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
