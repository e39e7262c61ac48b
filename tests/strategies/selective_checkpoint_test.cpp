// selective_checkpoint_test - Selective activation checkpointing
// (ActivationCheckpointOptions::policy "attention" and "op"): the kept ops'
// outputs are reused by the recompute, which must still give plain training's
// loss, gradients and RNG stream, skip exactly the kept ops, and cost the
// memory it says.
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/trainer/memory.h"
#include "tests/strategies/checkpoint_steps.h"

#include <gtest/gtest.h>

#include <string>

namespace {
using strata::ActivationCheckpointOptions;
using strata::recipes::GPTModule;
using namespace strata::testing;

const char* const kAttentionKernel = "strata::causal_attention_forward";

TEST(SelectiveCheckpointTest, PoliciesMatchPlainLossGradientsAndRngStream) {
  const auto batch = toy_batch();
  for (const std::string policy : {"attention", "op"}) {
    for (double dropout : {0.0, 0.2}) {
      for (int64_t every_n : {1, 2}) {
        SCOPED_TRACE(policy + " dropout=" + std::to_string(dropout) + " every_n=" + std::to_string(every_n));
        auto plain = make_gpt(dropout);
        auto checkpointed = make_gpt(dropout);
        strata::apply_activation_checkpointing(checkpointed,
                                               ActivationCheckpointOptions().every_n(every_n).policy(policy));
        const auto want = forward_backward(plain, batch, 42);
        const auto got = forward_backward(checkpointed, batch, 42);
        EXPECT_NEAR(got.loss, want.loss, 1e-6);
        EXPECT_LE(max_grad_diff(got, want), 1e-6);
        // The replayed attention draws its seed as the forward did, so the
        // residual dropout after it draws the forward's mask.
        EXPECT_TRUE(torch::equal(got.next_draw, want.next_draw));
      }
    }
  }
}

TEST(SelectiveCheckpointTest, PoliciesMatchPlainUnderBf16Autocast) {
  const auto batch = toy_batch();
  for (const std::string policy : {"attention", "op"}) {
    SCOPED_TRACE(policy);
    auto plain = make_gpt(0.1);
    auto checkpointed = make_gpt(0.1);
    strata::apply_activation_checkpointing(checkpointed, ActivationCheckpointOptions().policy(policy));
    const auto want = forward_backward(plain, batch, 42, strata::Precision::kBf16Mixed);
    const auto got = forward_backward(checkpointed, batch, 42, strata::Precision::kBf16Mixed);
    EXPECT_NEAR(got.loss, want.loss, 1e-6);
    EXPECT_LE(max_grad_diff(got, want), 1e-6);
  }
}

TEST(SelectiveCheckpointTest, TheRecomputeRunsNoKeptOp) {
  // Per checkpointed gpt block the full recompute runs 3 GEMMs (c_attn,
  // attn.c_proj, c_fc; the MLP's c_proj is skipped anyway) and the attention
  // kernel once. "attention" keeps the kernel's output; "op" also keeps the
  // 1st and 3rd matmuls' (c_attn, c_fc), leaving attn.c_proj.
  const auto batch = toy_batch();
  const int64_t n_layer = 3;
  struct Want {
    std::string policy;
    int64_t gemms, attentions;  // recomputed per block
  };
  for (const auto& [policy, gemms, attentions] :
       {Want{"full", 3, 1}, Want{"attention", 3, 0}, Want{"op", 1, 0}}) {
    SCOPED_TRACE(policy);
    auto plain = make_gpt(0.2);
    auto checkpointed = make_gpt(0.2);
    strata::apply_activation_checkpointing(checkpointed, ActivationCheckpointOptions().policy(policy));
    EXPECT_EQ(gemms_in_forward_backward(checkpointed, batch) - gemms_in_forward_backward(plain, batch),
              n_layer * gemms);
    EXPECT_EQ(ops_in_forward_backward(checkpointed, batch, {kAttentionKernel}) -
                  ops_in_forward_backward(plain, batch, {kAttentionKernel}),
              n_layer * attentions);
  }
}

TEST(SelectiveCheckpointTest, KeepsMoreThanFullAndLessThanNoCheckpointing) {
  // gpt-mini blocks on 8 x 64 tokens: each policy's peak lies between full
  // checkpointing's and none, in the order of what it keeps. Gradients are
  // allocated first (as DDP's bucket views are, and as the planner's probe
  // does), so the peak is where the kept outputs are, as backward starts,
  // and not at the last block's backward, when gradients have been allocated
  // and the kept outputs freed.
  strata::MemoryTracker tracker;
  const auto options = strata::recipes::gpt_preset("gpt-mini").vocab_size(64).block_size(64);
  auto peak = [&](const std::string& policy) {
    torch::manual_seed(0);
    GPTModule module(options);
    if (!policy.empty()) strata::apply_activation_checkpointing(module, ActivationCheckpointOptions().policy(policy));
    for (auto& p : module.module().parameters()) p.mutable_grad() = torch::zeros_like(p);
    const auto input = torch::randint(0, 64, {8, 64}, torch::kInt64);
    const strata::Batch data{input, input.roll(-1, 1)};
    const int64_t base = tracker.current_bytes();
    tracker.reset_peak();
    module.training_step(data).backward();
    return tracker.peak_bytes() - base;
  };
  const int64_t none = peak(""), full = peak("full"), attention = peak("attention"), op = peak("op");
  std::cout << "[ peak     ] gpt-mini 8x64: no checkpointing " << strata::format_bytes(none) << ", full "
            << strata::format_bytes(full) << ", attention " << strata::format_bytes(attention) << ", op "
            << strata::format_bytes(op) << "\n";
  // What each keeps per block beyond its input, [B,T,C] fp32 = 8·64·192·4 bytes:
  // attention's output (1 of those, and a small logsumexp), op's c_attn and
  // c_fc outputs besides (3 + 4). Six blocks; the peaks differ by at least
  // half of that (the recomputed block's own activations overlap).
  const int64_t btc = int64_t(8) * 64 * 192 * 4;
  EXPECT_GE(attention - full, 6 * btc / 2);
  EXPECT_GE(op - attention, 6 * 7 * btc / 2);
  EXPECT_LT(op, none);
}

TEST(SelectiveCheckpointTest, OutsideACheckpointedUnitOpsRunAsUsual) {
  const auto x = torch::randn({2, 3, 5}), w = torch::randn({4, 5}), b = torch::randn({4});
  EXPECT_TRUE(torch::equal(strata::checkpointed_linear(x, w, b), torch::linear(x, w, b)));
  EXPECT_TRUE(torch::equal(strata::checkpointed_linear(x, w, {}), torch::linear(x, w, {})));
}

TEST(SelectiveCheckpointTest, RejectsAnUnknownPolicyAndARecomputeThatRunsOtherOps) {
  try {
    strata::validate(ActivationCheckpointOptions().policy("selective"));
    FAIL() << "policy 'selective' accepted";
  } catch (const c10::ValueError& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("unknown policy 'selective'"), std::string::npos) << what;
    EXPECT_NE(what.find("full, attention, op"), std::string::npos) << what;
  }
  // A unit whose second run (the recompute) calls another kind of op.
  int calls = 0;
  auto w = torch::randn({4, 4}, torch::requires_grad());
  strata::UnitFn unit = [&](const torch::Tensor& x) {
    strata::CheckpointedOp op;
    op.kind = calls++ == 0 ? strata::KeptOp::attention : strata::KeptOp::matmul;
    op.run = [&] { return torch::linear(x, w, {}); };
    op.save = [&] { return std::vector<torch::Tensor>{torch::linear(x, w, {})}; };
    op.replay = [](std::vector<torch::Tensor> kept) { return kept[0]; };
    return strata::checkpointed_op(op);
  };
  auto y = strata::checkpoint(unit, torch::randn({2, 4}, torch::requires_grad()),
                              ActivationCheckpointOptions().policy("attention"));
  try {
    y.sum().backward();
    FAIL() << "a recompute running another op was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("that the forward did not run there"), std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
