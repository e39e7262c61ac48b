// rms_norm_test - the fused RMSNorm (kernels/rms_norm.h) against transformers'
// composite (x in fp32 · rsqrt(mean(x²) + eps), cast to x's dtype, times the
// weight) through autograd: output, dx and dweight, for fp32, bf16 and mixed
// x/weight dtypes, rows of widths with and without an 8-wide tail; a frozen
// weight gets no gradient; and a control.
#include "strata/kernels/rms_norm.h"
#include "strata/recipes/models/llama/llama.h"

#include <gtest/gtest.h>

#include <string>

namespace {
namespace kernels = strata::kernels;

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a32 = a.to(torch::kFloat32), b32 = b.to(torch::kFloat32);
  return (a32 - b32).abs().max().item<double>() / std::max(1e-30, b32.abs().max().item<double>());
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

}  // namespace
