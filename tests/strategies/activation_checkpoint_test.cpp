// activation_checkpoint_test - Unit tests for strategies/activation_checkpoint.cpp
// and the unit seam (core/training_module.h) it is installed through.
#include "strata/strategies/activation_checkpoint.h"

#include "strata/core/precision.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/grad_buckets.h"
#include "tests/mlp_stack.h"
#include "tests/strategies/checkpoint_steps.h"
#include "tests/toy_data.h"
#include "strata/trainer/memory.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace {
using strata::ActivationCheckpointOptions;
using strata::TrainingModule;
using strata::recipes::GPTModule;
using strata::testing::MlpStackModule;
using strata::testing::forward_backward;
using strata::testing::gemms_in_forward_backward;
using strata::testing::make_gpt;
using strata::testing::make_mlp;
using strata::testing::max_grad_diff;
using strata::testing::StepResult;
using strata::testing::toy_batch;

using ModuleFactory = std::function<std::unique_ptr<TrainingModule>(double dropout)>;

void expect_checkpointed_matches_plain(const std::string& model, const ModuleFactory& make) {
  const auto batch = toy_batch();
  for (double dropout : {0.0, 0.2}) {
    for (int64_t every_n : {1, 2}) {
      const std::string what = model + " dropout=" + std::to_string(dropout) + " every_n=" + std::to_string(every_n);
      auto plain = make(dropout);
      auto checkpointed = make(dropout);
      strata::apply_activation_checkpointing(*checkpointed, ActivationCheckpointOptions().every_n(every_n));
      const auto want = forward_backward(*plain, batch, 42);
      const auto got = forward_backward(*checkpointed, batch, 42);
      EXPECT_NEAR(got.loss, want.loss, 1e-6) << what;
      EXPECT_LE(max_grad_diff(got, want), 1e-6) << what;
      // The recompute replays the RNG and then puts the stream back: what is
      // drawn after backward is what plain training draws.
      EXPECT_TRUE(torch::equal(got.next_draw, want.next_draw)) << what;
    }
  }
}

TEST(ActivationCheckpointTest, GptNanoMatchesPlainLossAndGradients) {
  expect_checkpointed_matches_plain("gpt-nano", [](double dropout) {
    return std::make_unique<GPTModule>(make_gpt(dropout));
  });
}

TEST(ActivationCheckpointTest, UsersOwnModelMatchesPlainLossAndGradients) {
  expect_checkpointed_matches_plain("mlp-stack", [](double dropout) {
    return std::make_unique<MlpStackModule>(make_mlp(dropout));
  });
}

TEST(ActivationCheckpointTest, DropoutMasksDifferWithoutRngReplay) {
  // The control for the test above: without replaying the RNG the recompute
  // draws new dropout masks, and the gradients are those of another network.
  const auto batch = toy_batch();
  auto plain = make_gpt(0.2);
  auto checkpointed = make_gpt(0.2);
  strata::apply_activation_checkpointing(checkpointed, ActivationCheckpointOptions().preserve_rng_state(false));
  const auto want = forward_backward(plain, batch, 42);
  const auto got = forward_backward(checkpointed, batch, 42);
  EXPECT_NEAR(got.loss, want.loss, 1e-6);  // the forward itself drew the same masks
  EXPECT_GT(max_grad_diff(got, want), 1e-4);
}

TEST(ActivationCheckpointTest, RecomputesUnderTheForwardsAutocast) {
  // bf16-mixed on CPU: the Trainer's autocast region ends before backward, so
  // the recompute must re-enter it, or it would run in fp32 and back-propagate
  // through other activations than the forward's.
  const auto batch = toy_batch();
  auto plain = make_gpt(0.0);
  auto checkpointed = make_gpt(0.0);
  auto fp32 = make_gpt(0.0);
  strata::apply_activation_checkpointing(checkpointed, ActivationCheckpointOptions());
  const auto want = forward_backward(plain, batch, 42, strata::Precision::kBf16Mixed);
  const auto got = forward_backward(checkpointed, batch, 42, strata::Precision::kBf16Mixed);
  const auto full = forward_backward(fp32, batch, 42);
  EXPECT_NEAR(got.loss, want.loss, 1e-6);
  EXPECT_LE(max_grad_diff(got, want), 1e-6);
  // bf16 is visible in the gradients, so a recompute in fp32 would show.
  EXPECT_GT(max_grad_diff(want, full), 1e-5);
  // And the recompute left this thread's autocast state as it found it.
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST(ActivationCheckpointTest, GradientHooksOnAccumulateGradFireOncePerParameter) {
  // The hooks DDP and SDP use (post-hooks on each parameter's AccumulateGrad):
  // the backward through the recomputed graph must reach the same nodes, each
  // parameter exactly once (GradReadiness throws on a second time).
  auto module = make_gpt(0.0);
  strata::apply_activation_checkpointing(module, ActivationCheckpointOptions());
  const auto params = module.module().parameters();
  std::vector<size_t> launched;
  strata::GradReadiness readiness(params, strata::assign_buckets(params, 1),
                                  [&](size_t bucket) { launched.push_back(bucket); });
  readiness.install_hooks([] { return true; });
  for (int round = 0; round < 2; ++round) {
    readiness.reset();
    launched.clear();
    module.training_step(toy_batch()).backward();
    EXPECT_TRUE(readiness.unready_params().empty()) << "round " << round;
    EXPECT_TRUE(readiness.all_launched()) << "round " << round;
    EXPECT_EQ(launched.size(), params.size()) << "round " << round;
  }
}

TEST(ActivationCheckpointTest, SeamRunsEachUnitOnceAndRecomputesOnlyCheckpointedUnits) {
  // A user's model with 5 units: a counting runner next to the units, AC on
  // every 2nd unit (0, 2, 4) around it, and another counting runner outside.
  auto module = make_mlp(0.0, /*depth=*/5);
  std::vector<int64_t> inner_calls, outer_calls;
  module.set_unit_runner([&](int64_t unit, const torch::Tensor& x, const strata::UnitFn& forward) {
    inner_calls.push_back(unit);
    return forward(x);
  });
  strata::apply_activation_checkpointing(module, ActivationCheckpointOptions().every_n(2));
  module.add_unit_runner([&](int64_t unit, const torch::Tensor& x, const strata::UnitFn& forward) {
    outer_calls.push_back(unit);
    return forward(x);
  });
  auto block_calls = [&] {
    std::vector<int64_t> calls;
    for (auto& block : module.net().blocks) calls.push_back(block->calls);
    return calls;
  };
  const auto batch = toy_batch();
  auto loss = module.training_step(batch);
  EXPECT_EQ(inner_calls, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(outer_calls, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(block_calls(), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  loss.backward();
  // Backward recomputes the checkpointed units, last first, through the
  // runners inside the checkpoint only.
  EXPECT_EQ(inner_calls, (std::vector<int64_t>{0, 1, 2, 3, 4, 4, 2, 0}));
  EXPECT_EQ(outer_calls, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(block_calls(), (std::vector<int64_t>{2, 1, 2, 1, 2}));
  for (const auto& p : module.module().parameters()) EXPECT_TRUE(p.grad().defined());
  // Without grad (validation) the runners run, nothing is checkpointed.
  {
    torch::NoGradGuard no_grad;
    module.validation_step(batch);
  }
  EXPECT_EQ(inner_calls.size(), 13u);
  EXPECT_EQ(outer_calls.size(), 10u);
  EXPECT_EQ(block_calls(), (std::vector<int64_t>{3, 2, 3, 2, 3}));
}

TEST(ActivationCheckpointTest, RecomputeSkipsTheGemmWhoseOutputBackwardNeverReads) {
  // A GPT block's MLP projection reaches the block's output only through
  // dropout and the residual add, so its recompute computes no product
  // (linear_output_unread_in_recompute): 3 GEMMs recomputed per block, not 4.
  const auto batch = toy_batch();
  for (const bool lora : {false, true}) {
    SCOPED_TRACE(lora ? "LoRA on attn and mlp" : "no LoRA");
    auto make = [&] {
      torch::manual_seed(3);
      auto o = strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).dropout(0.2);
      if (lora) o.lora_rank(2).lora_targets("attn,mlp");
      return GPTModule(o);
    };
    auto plain = make();
    auto checkpointed = make();
    strata::apply_activation_checkpointing(checkpointed, ActivationCheckpointOptions());
    const int64_t n_layer = 3;
    // LoRA adds 2 GEMMs to each of c_attn, c_proj (attn), c_fc and c_proj (mlp).
    const int64_t recomputed_per_block = lora ? 3 + 8 : 3;
    EXPECT_EQ(gemms_in_forward_backward(checkpointed, batch) - gemms_in_forward_backward(plain, batch),
              n_layer * recomputed_per_block);
    const auto want = forward_backward(plain, batch, 42);
    const auto got = forward_backward(checkpointed, batch, 42);
    EXPECT_NEAR(got.loss, want.loss, 1e-6);
    EXPECT_LE(max_grad_diff(got, want), 1e-6);
  }
  // Outside a recompute it is torch::linear, with or without a bias.
  EXPECT_FALSE(strata::is_recomputing());
  const auto x = torch::randn({2, 3, 5}), w = torch::randn({4, 5}), b = torch::randn({4});
  EXPECT_TRUE(torch::equal(strata::linear_output_unread_in_recompute(x, w, b), torch::linear(x, w, b)));
  EXPECT_TRUE(torch::equal(strata::linear_output_unread_in_recompute(x, w, {}), torch::linear(x, w, {})));
}

TEST(ActivationCheckpointTest, UnitFedDataThatNeedsNoGradStillTrains) {
  // A first unit fed raw data: its input does not require grad, yet its
  // parameters get the same gradients as without checkpointing.
  torch::manual_seed(3);
  auto unit = torch::nn::Linear(6, 5);
  const auto x = torch::randn({4, 6});
  strata::UnitFn forward = [unit](const torch::Tensor& t) mutable { return torch::tanh(unit(t)); };
  forward(x).pow(2).sum().backward();
  const auto want_w = unit->weight.grad().clone();
  const auto want_b = unit->bias.grad().clone();
  unit->zero_grad();
  auto out = strata::checkpoint(forward, x);
  ASSERT_TRUE(out.requires_grad());
  out.pow(2).sum().backward();
  ASSERT_TRUE(unit->weight.grad().defined());
  EXPECT_LE((unit->weight.grad() - want_w).abs().max().item<double>(), 1e-6);
  EXPECT_LE((unit->bias.grad() - want_b).abs().max().item<double>(), 1e-6);
  EXPECT_FALSE(x.grad().defined());
}

TEST(ActivationCheckpointTest, InputGradientFlowsToEarlierLayers) {
  // The input's gradient comes back out of the checkpoint into the outer graph.
  torch::manual_seed(4);
  auto unit = torch::nn::Linear(6, 6);
  strata::UnitFn forward = [unit](const torch::Tensor& t) mutable { return torch::gelu(unit(t)); };
  const auto leaf = torch::randn({3, 6}, torch::requires_grad());
  forward(leaf * 2).sum().backward();
  const auto want = leaf.grad().clone();
  leaf.mutable_grad() = torch::Tensor();
  strata::checkpoint(forward, leaf * 2).sum().backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_LE((leaf.grad() - want).abs().max().item<double>(), 1e-6);
}

TEST(ActivationCheckpointTest, RejectsBadOptionsAndModulesWithoutUnits) {
  try {
    strata::checkpoint_runner(ActivationCheckpointOptions().every_n(0));
    FAIL() << "every_n 0 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("every_n must be >= 1"), std::string::npos);
    EXPECT_NE(std::string(e.what_without_backtrace()).find("got 0"), std::string::npos);
  }
  class NoUnits : public TrainingModule {
   public:
    torch::nn::Module& module() override { return root_; }
    torch::Tensor training_step(const strata::Batch&) override { return {}; }
    strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

   private:
    torch::nn::Module root_;
  } no_units;
  EXPECT_THROW(strata::apply_activation_checkpointing(no_units, ActivationCheckpointOptions()), c10::Error);
}

TEST(ActivationCheckpointTest, SecondBackwardWithoutRetainGraphIsAnError) {
  auto module = make_mlp(0.0, 2);
  strata::apply_activation_checkpointing(module, ActivationCheckpointOptions());
  auto loss = module.training_step(toy_batch());
  loss.backward();
  EXPECT_THROW(loss.backward(), c10::Error);
}

/// Bytes autograd keeps for backward in one gpt block (dropout 0), besides
/// its input: ln_1 out, qkv (3), attention output before c_proj, the residual
/// sum, ln_2 out, c_fc out (4, for gelu), gelu out (4, for c_proj) = 15 x
/// [B,T,C] floats, and the softmax output [B,H,T,T].
int64_t saved_bytes_per_block(int64_t b, int64_t t, int64_t c, int64_t h) {
  return 4 * (15 * b * t * c + b * h * t * t);
}

TEST(ActivationCheckpointTest, LowersPeakActivationMemory) {
  // gpt-mini blocks (6 layers, 6 heads, 192 wide) on 8 x 64 tokens.
  const int64_t batch = 8, seq = 64, layers = 6, heads = 6, width = 192;
  strata::MemoryTracker tracker;
  auto options = strata::recipes::gpt_preset("gpt-mini").vocab_size(64).block_size(seq);
  int64_t block_param_bytes = 0;
  auto measure = [&](bool checkpointed) {
    torch::manual_seed(0);
    GPTModule module(options);
    if (checkpointed) strata::apply_activation_checkpointing(module, ActivationCheckpointOptions());
    block_param_bytes = 0;
    for (const auto& unit : module.wrap_units()) {
      for (const auto& p : unit->parameters()) block_param_bytes += p.numel() * 4;
    }
    const auto input = torch::randint(0, 64, {batch, seq}, torch::kInt64);
    const strata::Batch data{input, input.roll(-1, 1)};
    const int64_t base = tracker.current_bytes();
    tracker.reset_peak();
    module.training_step(data).backward();
    return tracker.peak_bytes() - base;
  };
  const int64_t plain = measure(false);
  const int64_t checkpointed = measure(true);
  // The saved-activation difference: without checkpointing all blocks' saved
  // tensors are alive when backward starts; with it each block keeps only its
  // input [B,T,C], plus one block's recomputed activations during backward.
  const int64_t input_bytes = 4 * batch * seq * width;
  const int64_t difference = (layers - 1) * saved_bytes_per_block(batch, seq, width, heads) - layers * input_bytes;
  // The peaks differ by less: plain training peaks as backward starts, before
  // most gradients exist; checkpointed training peaks recomputing block 0,
  // when every block's gradients (block_param_bytes, about a third of the
  // difference here) have been allocated. Hence "at least half".
  std::cout << "[ peak     ] forward+backward, gpt-mini blocks, " << batch << "x" << seq
            << " tokens: plain " << strata::format_bytes(plain) << ", checkpointed "
            << strata::format_bytes(checkpointed) << ", saving " << strata::format_bytes(plain - checkpointed)
            << "; saved-activation difference " << strata::format_bytes(difference)
            << ", block gradients " << strata::format_bytes(block_param_bytes) << "\n";
  EXPECT_GE(plain - checkpointed, difference / 2);
  // Tighter: the difference less the block gradients checkpointing's peak
  // carries and one [B,T,4C] backward temporary.
  EXPECT_GE(plain - checkpointed, difference - block_param_bytes - 4 * input_bytes);
}

}  // namespace
