// attention_test - the fused causal attention (kernels/attention.h) against the
// naive reference: outputs and q/k/v gradients, fp32 and bf16, with and
// without dropout (the naive run is fed the fused kernel's own mask), grouped
// queries against repeated keys and values, and the GPT's --attention choice.
#include "strata/kernels/attention.h"

#include "strata/core/precision.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "tests/scoped_env.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {
namespace kernels = strata::kernels;

struct Inputs {
  torch::Tensor q, k, v, grad_out;
};

/// q, k, v as the GPT makes them: [B, H, T, D] views of a [B, T, 3·H·D] tensor.
Inputs make_inputs(int64_t B, int64_t H, int64_t T, int64_t D, uint64_t seed,
                   torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  auto qkv = torch::randn({B, T, 3 * H * D}).to(dtype).split(H * D, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
  return {heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), torch::randn({B, H, T, D}).to(dtype)};
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

/// Fused kernels called directly (forward, then backward with `grad_out`).
Result fused(const Inputs& in, double p, uint64_t seed) {
  auto fwd = kernels::causal_attention_forward(in.q, in.k, in.v, p, seed);
  auto g = kernels::causal_attention_backward(in.grad_out, in.q, in.k, in.v, fwd.out_fp32, fwd.lse, p, seed);
  return {fwd.out, g.dq, g.dk, g.dv};
}

/// The naive reference through autograd, in fp32, fed the same keep mask.
Result naive(const Inputs& in, double p, uint64_t seed) {
  auto q = in.q.detach().to(torch::kFloat32).requires_grad_();
  auto k = in.k.detach().to(torch::kFloat32).requires_grad_();
  auto v = in.v.detach().to(torch::kFloat32).requires_grad_();
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2);
  torch::Tensor keep = p > 0 ? kernels::dropout_keep_mask(B * H, T, p, seed) : torch::Tensor();
  auto out = kernels::naive_causal_attention(q, k, v, keep, p);
  out.backward(in.grad_out.to(torch::kFloat32));
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

/// max |a - b| / max(1, max |b|): absolute for O(1) values, relative for large ones.
double scaled_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a32 = a.to(torch::kFloat32), b32 = b.to(torch::kFloat32);
  if (a32.numel() == 0) return 0.0;
  return (a32 - b32).abs().max().item<double>() / std::max(1.0, b32.abs().max().item<double>());
}

void expect_close(const Result& got, const Result& want, double tol, const std::string& what) {
  EXPECT_EQ(got.out.sizes(), want.out.sizes()) << what;
  EXPECT_LE(scaled_diff(got.out, want.out), tol) << what << " output";
  EXPECT_LE(scaled_diff(got.dq, want.dq), tol) << what << " dq";
  EXPECT_LE(scaled_diff(got.dk, want.dk), tol) << what << " dk";
  EXPECT_LE(scaled_diff(got.dv, want.dv), tol) << what << " dv";
}

struct Case {
  int64_t B, H, T, D;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t T : {1, 7, 64, 255}) {
    for (int64_t D : {8, 24, 64}) out.push_back({2, 3, T, D});
  }
  out.push_back({1, 2, 1024, 64});
  out.push_back({1, 1, 1024, 40});
  return out;
}

std::string describe(const Case& c, double p) {
  return "B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " T" + std::to_string(c.T) +
         " D" + std::to_string(c.D) + " p" + std::to_string(p);
}

TEST(AttentionTest, FusedMatchesNaiveFp32) {
  for (const Case& c : cases()) {
    for (double p : {0.0, 0.3}) {
      const auto in = make_inputs(c.B, c.H, c.T, c.D, 1000 + c.T + c.D);
      expect_close(fused(in, p, 77), naive(in, p, 77), 1e-5, describe(c, p));
    }
  }
}

TEST(AttentionTest, FusedMatchesNaiveBf16) {
  for (const Case& c : cases()) {
    for (double p : {0.0, 0.3}) {
      const auto in = make_inputs(c.B, c.H, c.T, c.D, 2000 + c.T + c.D, torch::kBFloat16);
      const auto got = fused(in, p, 5);
      EXPECT_EQ(got.out.scalar_type(), torch::kBFloat16);
      EXPECT_EQ(got.dq.scalar_type(), torch::kBFloat16);
      expect_close(got, naive(in, p, 5), 1e-2, describe(c, p) + " bf16");
    }
  }
}

TEST(AttentionTest, Bf16ProductsMatchTheFp32TilesOnBf16Inputs) {
  // The AVX512-BF16 tiles round P, dO and dS to bf16 before their products;
  // the fp32 tiles (STRATA_ATTENTION_BF16=0) read bf16 inputs into fp32. Both
  // stay within bf16's tolerance of each other (and of the naive reference,
  // above), and they are two paths: their gradients differ.
  if (!kernels::bf16_products_available()) {
    GTEST_SKIP() << "this CPU has no avx512_bf16: bf16 inputs take the fp32 tiles (FusedMatchesNaiveBf16 covers them)";
  }
  double largest = 0.0;
  for (const Case& c : cases()) {
    for (double p : {0.0, 0.3}) {
      const auto in = make_inputs(c.B, c.H, c.T, c.D, 4000 + c.T + c.D, torch::kBFloat16);
      const auto bf16 = fused(in, p, 9);
      Result fp32;
      {
        strata::testing::ScopedEnv off("STRATA_ATTENTION_BF16", "0");
        ASSERT_FALSE(kernels::bf16_products_available());
        fp32 = fused(in, p, 9);
      }
      expect_close(bf16, fp32, 1e-2, describe(c, p) + " bf16 products vs fp32 tiles");
      largest = std::max(largest, scaled_diff(bf16.dq, fp32.dq));
    }
  }
  EXPECT_GT(largest, 0.0) << "the two paths gave identical dq everywhere: the switch changed nothing";
}

TEST(AttentionTest, FusedMatchesNaiveFp16) {
  // 16-mixed: autocast hands the kernel fp16 q, k, v (read as fp32, like bf16).
  for (const Case& c : cases()) {
    for (double p : {0.0, 0.3}) {
      const auto in = make_inputs(c.B, c.H, c.T, c.D, 3000 + c.T + c.D, torch::kHalf);
      const auto got = fused(in, p, 5);
      EXPECT_EQ(got.out.scalar_type(), torch::kHalf);
      EXPECT_EQ(got.dq.scalar_type(), torch::kHalf);
      expect_close(got, naive(in, p, 5), 5e-3, describe(c, p) + " fp16");
    }
  }
}

TEST(AttentionTest, DropoutMaskIsDeterministicPerSeedWithTheRightRate) {
  const auto a = kernels::dropout_keep_mask(6, 256, 0.25, 123);
  EXPECT_TRUE(torch::equal(a, kernels::dropout_keep_mask(6, 256, 0.25, 123)));
  const auto b = kernels::dropout_keep_mask(6, 256, 0.25, 124);
  EXPECT_FALSE(torch::equal(a, b));
  const double kept = a.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(kept, 0.75, 0.005);  // 393k draws: the std error is ~0.0007
  // Heads and rows draw independently: two heads' masks differ.
  EXPECT_FALSE(torch::equal(a[0], a[1]));
  EXPECT_TRUE(kernels::dropout_keep_mask(2, 16, 0.0, 9).all().item<bool>());
}

TEST(AttentionTest, DropoutChangesTheOutputAndBackwardUsesTheForwardsMask) {
  // The control: a wrong mask in the backward (another seed) gives other
  // gradients, so the parity above is not vacuous.
  const auto in = make_inputs(2, 2, 64, 16, 3);
  const auto plain = fused(in, 0.0, 1);
  const auto dropped = fused(in, 0.5, 1);
  EXPECT_GT(scaled_diff(dropped.out, plain.out), 1e-2);
  auto fwd = kernels::causal_attention_forward(in.q, in.k, in.v, 0.5, 1);
  auto wrong = kernels::causal_attention_backward(in.grad_out, in.q, in.k, in.v, fwd.out, fwd.lse, 0.5, 2);
  EXPECT_GT(scaled_diff(wrong.dv, dropped.dv), 1e-2);
}

TEST(AttentionTest, AutogradFunctionDrawsItsSeedFromTheDefaultGenerator) {
  const auto in = make_inputs(2, 3, 33, 16, 11);
  auto q = in.q.detach().clone().requires_grad_(), k = in.k.detach().clone().requires_grad_(),
       v = in.v.detach().clone().requires_grad_();
  torch::manual_seed(99);
  auto out = kernels::causal_attention(q, k, v, 0.2, /*training=*/true);
  out.backward(in.grad_out);
  torch::manual_seed(99);
  const uint64_t seed = kernels::draw_dropout_seed();
  const auto want = naive(in, 0.2, seed);
  expect_close({out.detach(), q.grad(), k.grad(), v.grad()}, want, 1e-5, "autograd");
  // Not training: no dropout, nothing drawn.
  torch::manual_seed(99);
  auto eval = kernels::causal_attention(in.q, in.k, in.v, 0.2, /*training=*/false);
  EXPECT_LE(scaled_diff(eval, naive(in, 0.0, 0).out), 1e-5);
  EXPECT_EQ(kernels::draw_dropout_seed(), seed);
}

TEST(AttentionTest, GroupedQueriesMatchNaiveOnRepeatedKeysAndValues) {
  // 6 query heads over 2 kv heads (query head h reads kv head h / 3), fp32
  // and bf16, with and without dropout: against the naive reference on k and
  // v repeated as transformers' repeat_kv does, whose gradients sum back over
  // each kv head's group.
  const int64_t B = 2, H = 6, Hkv = 2, D = 24;
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (const int64_t T : {7, 255}) {
      for (const double p : {0.0, 0.3}) {
        const std::string what = std::string(dtype == torch::kFloat32 ? "fp32" : "bf16") + " T" + std::to_string(T) +
                                 " p" + std::to_string(p);
        torch::manual_seed(T);
        const auto q = torch::randn({B, H, T, D}).to(dtype), k = torch::randn({B, Hkv, T, D}).to(dtype);
        const auto v = torch::randn({B, Hkv, T, D}).to(dtype), grad_out = torch::randn({B, H, T, D}).to(dtype);
        const auto forward = kernels::causal_attention_forward(q, k, v, p, 31);
        const auto g = kernels::causal_attention_backward(grad_out, q, k, v, forward.out_fp32, forward.lse, p, 31);
        EXPECT_EQ(g.dk.sizes(), k.sizes()) << what;
        auto q32 = q.to(torch::kFloat32).requires_grad_(), k32 = k.to(torch::kFloat32).requires_grad_();
        auto v32 = v.to(torch::kFloat32).requires_grad_();
        const auto keep = p > 0 ? kernels::dropout_keep_mask(B * H, T, p, 31) : torch::Tensor();
        auto out = kernels::naive_causal_attention(q32, k32.repeat_interleave(H / Hkv, 1),
                                                   v32.repeat_interleave(H / Hkv, 1), keep, p);
        out.backward(grad_out.to(torch::kFloat32));
        expect_close({forward.out, g.dq, g.dk, g.dv}, {out.detach(), q32.grad(), k32.grad(), v32.grad()},
                     dtype == torch::kFloat32 ? 1e-5 : 1e-2, what);
      }
    }
  }
}

TEST(AttentionTest, RejectsBadInputs) {
  const auto in = make_inputs(1, 1, 4, 8, 0);
  EXPECT_THROW(kernels::causal_attention_forward(in.q, in.k, in.v, 1.0, 0), c10::Error);
  EXPECT_THROW(kernels::causal_attention_forward(in.q, in.k.to(torch::kBFloat16), in.v, 0.0, 0), c10::Error);
  EXPECT_THROW(kernels::causal_attention_forward(in.q.to(torch::kFloat64), in.k.to(torch::kFloat64),
                                                 in.v.to(torch::kFloat64), 0.0, 0),
               c10::Error);
  EXPECT_THROW(kernels::causal_attention_forward(in.q[0], in.k[0], in.v[0], 0.0, 0), c10::Error);
  // Grouped queries: the kv heads must divide the query heads.
  const auto six = make_inputs(1, 6, 4, 8, 0), four = make_inputs(1, 4, 4, 8, 0);
  EXPECT_THROW(kernels::causal_attention_forward(six.q, four.k, four.v, 0.0, 0), c10::Error);
}

strata::recipes::GPTOptions tiny_gpt(const std::string& attention, double dropout = 0.0) {
  return strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(32).dropout(dropout).attention(attention);
}

/// Logits and parameter gradients of one forward + backward (train mode).
std::pair<torch::Tensor, std::vector<torch::Tensor>> gpt_step(const std::string& attention,
                                                               strata::Precision precision) {
  torch::manual_seed(5);
  strata::recipes::GPT model(tiny_gpt(attention));
  auto idx = torch::randint(16, {3, 32}, torch::kLong);
  torch::Tensor logits;
  {
    strata::AutocastGuard autocast(precision);
    logits = model->forward(idx);
  }
  logits.to(torch::kFloat32).square().mean().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return {logits.detach().to(torch::kFloat32), grads};
}

TEST(AttentionTest, GptWithFusedOrSdpaAttentionMatchesNaive) {
  for (const std::string attention : {"fused", "sdpa"})
  for (auto precision : {strata::Precision::kFp32, strata::Precision::kBf16Mixed}) {
    const double tol = precision == strata::Precision::kFp32 ? 1e-5 : 2e-2;
    const auto [naive_logits, naive_grads] = gpt_step("naive", precision);
    const auto [fused_logits, fused_grads] = gpt_step(attention, precision);
    const std::string what = attention + " " + strata::to_string(precision);
    EXPECT_LE(scaled_diff(fused_logits, naive_logits), tol) << what;
    ASSERT_EQ(fused_grads.size(), naive_grads.size());
    for (size_t i = 0; i < naive_grads.size(); ++i) {
      EXPECT_LE(scaled_diff(fused_grads[i], naive_grads[i]), tol) << what << " parameter " << i;
    }
  }
}

TEST(AttentionTest, GptRejectsUnknownAttention) {
  try {
    strata::recipes::validate(tiny_gpt("flash"));
    FAIL() << "no error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_NE(message.find("unknown attention 'flash'; available: fused, sdpa, naive"), std::string::npos) << message;
  }
}

}  // namespace
