// fsdp_test - FSDP (ZeRO-3) against single-process training, ranks as threads:
// every sharding strategy at world sizes 1-4, with accumulation and clipping,
// tied and untied embeddings, both wrap policies, a unit smaller than the
// world (padding), and FSDP(checkpoint(block)). Memory, bytes sent, failure
// and the FlatParam mechanics are in fsdp_mechanics_test.cpp.
#include "tests/strategies/fsdp/fsdp_harness.h"

#include "strata/strategies/activation_checkpoint.h"
#include "tests/mlp_stack.h"

#include <gtest/gtest.h>

namespace {
using strata::FSDPOptions;
using strata::ShardingStrategy;
using strata::testing::FsdpRun;
using strata::testing::ModuleFactory;
using namespace strata::testing;

struct Case {
  ShardingStrategy sharding = ShardingStrategy::kFullShard;
  int world = 2;
  int64_t accum = 1;
  double clip = 0.0;
  c10::optional<bool> reshard_after_forward;
  strata::WrapPolicy wrap = strata::WrapPolicy::kBlock;
  bool tie = true;
  bool limit_all_gathers = true;
};

Case make_case(ShardingStrategy sharding, int world, int64_t accum = 1, double clip = 0.0) {
  Case c;
  c.sharding = sharding;
  c.world = world;
  c.accum = accum;
  c.clip = clip;
  return c;
}

std::string label(const Case& c) {
  return strata::to_string(c.sharding) + " world=" + std::to_string(c.world) + " accum=" +
         std::to_string(c.accum) + " clip=" + std::to_string(c.clip) + " reshard_after_forward=" +
         (c.reshard_after_forward ? std::to_string(*c.reshard_after_forward) : "default") +
         " wrap=" + strata::to_string(c.wrap) + " tie=" + std::to_string(c.tie) +
         " limit_all_gathers=" + std::to_string(c.limit_all_gathers);
}

/// Six AdamW steps: parameters within 3e-5 of single-process training on the
/// same global batch (not 1e-5: see strategy_threads_test's expect_parity,
/// an element whose first gradient is rounding noise ends 1.7e-5 apart), and every step's gradient norm within 1e-5 relative (a
/// wrong mean over ranks or a gradient counted twice shows there first).
void expect_parity(const Case& c) {
  SCOPED_TRACE(label(c));
  const int64_t per_rank_batch = 2, steps = 6;
  const auto make = gpt_nano(c.tie);
  const auto reference = train_single(make, fsdp_test_options(per_rank_batch * c.world, c.accum, c.clip, steps));
  FsdpRun run;
  run.world = c.world;
  run.options = FSDPOptions().sharding_strategy(c.sharding).wrap_policy(c.wrap).limit_all_gathers(c.limit_all_gathers);
  run.options.reshard_after_forward(c.reshard_after_forward);
  const auto got = train_fsdp(make, fsdp_test_options(per_rank_batch, c.accum, c.clip, steps), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 3e-5);
  ASSERT_EQ(reference.grad_norms.size(), got[0].grad_norms.size());
  for (size_t s = 0; s < reference.grad_norms.size(); ++s) {
    EXPECT_NEAR(got[0].grad_norms[s], reference.grad_norms[s], 1e-5 * reference.grad_norms[s]) << "step " << s + 1;
  }
}

TEST(FsdpParityTest, FullShardMatchesSingleProcessAtWorldSizesOneToFour) {
  for (int world : {1, 2, 3, 4}) expect_parity(make_case(ShardingStrategy::kFullShard, world));
}

TEST(FsdpParityTest, ShardGradOpAndNoShardMatchSingleProcess) {
  for (int world : {2, 3}) {
    expect_parity(make_case(ShardingStrategy::kShardGradOp, world));
    expect_parity(make_case(ShardingStrategy::kNoShard, world));
  }
  auto unlimited = make_case(ShardingStrategy::kShardGradOp, 3);
  unlimited.limit_all_gathers = false;  // prefetches every next unit
  expect_parity(unlimited);
}

TEST(FsdpParityTest, FullShardWithoutReshardAfterForwardMatches) {
  auto c = make_case(ShardingStrategy::kFullShard, 3);
  c.reshard_after_forward = false;
  expect_parity(c);
}

TEST(FsdpParityTest, AccumulationAndClippingMatch) {
  // Clipping at 0.5 is active (gpt-nano's gradient norm starts above 1); the
  // norm is all-reduced over shards, so a wrong shard gradient shows twice.
  for (auto sharding : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard}) {
    expect_parity(make_case(sharding, 3, 2, 0.5));
  }
  expect_parity(make_case(ShardingStrategy::kFullShard, 4, 3, 0.5));
}

TEST(FsdpParityTest, UntiedEmbeddingsAndWholeModelAsOneUnitMatch) {
  Case untied;
  untied.tie = false;
  expect_parity(untied);
  Case one_unit;
  one_unit.world = 3;
  one_unit.wrap = strata::WrapPolicy::kNone;
  expect_parity(one_unit);
}

TEST(FsdpParityTest, Bf16MixedPrecisionMatchesSingleProcess) {
  // Autocast casts the gathered fp32 parameters inside each unit; bf16
  // rounding depends on the batch split, hence parity_test's bf16 tolerance.
  auto options = fsdp_test_options(4, 1, 0.0, 4).precision(strata::Precision::kBf16Mixed);
  const auto reference = train_single(gpt_nano(), options);
  FsdpRun run;
  const auto got = train_fsdp(gpt_nano(), options.batch_size(2), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 5e-3);
  const double relative = relative_update_error(clone_params(*gpt_nano()()), reference.params, got[0].params);
  std::cout << "[ fsdp bf16 ] relative update error " << relative << std::endl;
  EXPECT_LE(relative, 0.1);
}

// ---- a unit with fewer elements than ranks -------------------------------

/// embed -> unit 0: y = x * s[0] + s[1] (2 parameters' worth of elements) ->
/// unit 1: Linear(4, 4) -> head. At world 4 two ranks hold only padding of unit 0.
class TinyUnitsModule : public strata::TrainingModule {
 public:
  TinyUnitsModule() : net_(std::make_shared<torch::nn::Module>()) {
    embed_ = net_->register_module("embed", torch::nn::Embedding(16, 4));
    scale_ = net_->register_module("scale", std::make_shared<torch::nn::Module>());
    s_ = scale_->register_parameter("s", torch::tensor({1.0f, 0.0f}));
    lin_ = net_->register_module("lin", torch::nn::Linear(4, 4));
    head_ = net_->register_module("head", torch::nn::Linear(4, 16));
  }
  torch::nn::Module& module() override { return *net_; }
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override { return {scale_, lin_.ptr()}; }
  torch::Tensor training_step(const strata::Batch& b) override {
    auto x = embed_(b.input);
    x = run_unit(0, x, [s = s_](const torch::Tensor& t) { return t * s[0] + s[1]; });
    x = run_unit(1, x, [lin = lin_.ptr()](const torch::Tensor& t) { return torch::tanh(lin->forward(t)); });
    auto logits = head_(x);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, 16}), b.target.reshape({-1}));
  }
  strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

 private:
  std::shared_ptr<torch::nn::Module> net_, scale_;
  torch::nn::Embedding embed_{nullptr};
  torch::Tensor s_;
  torch::nn::Linear lin_{nullptr}, head_{nullptr};
};

TEST(FsdpParityTest, UnitSmallerThanTheWorldIsPaddedAndMatches) {
  const ModuleFactory make = [] {
    torch::manual_seed(5);
    return std::make_unique<TinyUnitsModule>();
  };
  const auto reference = train_single(make, fsdp_test_options(8, 1, 0.0, 6));
  FsdpRun run;
  run.world = 4;
  const auto got = train_fsdp(make, fsdp_test_options(2, 1, 0.0, 6), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 1e-5);
  // The scale really moved (its gradient is not lost in the padding).
  EXPECT_GT((got[0].params[1] - torch::tensor({1.0f, 0.0f})).abs().max().item<double>(), 1e-4);
}

/// embed -> unit 0: y = x * a (its parameter b, 2-D, is never used) -> head.
class UnusedParameterModule : public strata::TrainingModule {
 public:
  UnusedParameterModule() : net_(std::make_shared<torch::nn::Module>()) {
    embed_ = net_->register_module("embed", torch::nn::Embedding(16, 4));
    unit_ = net_->register_module("unit", std::make_shared<torch::nn::Module>());
    a_ = unit_->register_parameter("a", torch::ones({4}));
    unit_->register_parameter("b", torch::ones({4, 4}));  // 2-D: AdamW decays it when stepped
    head_ = net_->register_module("head", torch::nn::Linear(4, 16));
  }
  torch::nn::Module& module() override { return *net_; }
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override { return {unit_}; }
  torch::Tensor training_step(const strata::Batch& b) override {
    auto x = run_unit(0, embed_(b.input), [a = a_](const torch::Tensor& t) { return t * a; });
    return torch::nn::functional::cross_entropy(head_(x).reshape({-1, 16}), b.target.reshape({-1}));
  }
  strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

 private:
  std::shared_ptr<torch::nn::Module> net_, unit_;
  torch::nn::Embedding embed_{nullptr};
  torch::Tensor a_;
  torch::nn::Linear head_{nullptr};
};

TEST(FsdpParityTest, ParameterWithoutGradientIsAnErrorNamingIt) {
  // b is in unit 0 and gets no gradient: the unit's post-backward never fires
  // from the hooks; reduce_gradients() reduces it (and the root queued behind
  // it), then the ranks agree that b had no gradient anywhere.
  const ModuleFactory make = [] {
    torch::manual_seed(6);
    return std::make_unique<UnusedParameterModule>();
  };
  FsdpRun run;
  try {
    train_fsdp(make, fsdp_test_options(2, 1, 0.0, 4), run);
    ADD_FAILURE() << "expected an error naming unit.b";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("fsdp: 1 parameter(s) received no gradient in this step: unit.b on 2 of 2 rank(s)"),
              std::string::npos) << what;
  }
}

TEST(FsdpParityTest, ParameterWithoutGradientWithFindUnusedParametersMatchesSingleProcess) {
  // b is 2-D, so in AdamW's decayed group: single-process training skips it
  // (no .grad), so FSDP must hide its shard pieces from AdamW, or b decays
  // (by about lr * weight_decay = 1e-3 per step here).
  const ModuleFactory make = [] {
    torch::manual_seed(6);
    return std::make_unique<UnusedParameterModule>();
  };
  const auto options = fsdp_test_options(2, 1, 0.0, 4).lr(1e-2);
  const auto reference = train_single(make, fsdp_test_options(4, 1, 0.0, 4).lr(1e-2));
  FsdpRun run;
  run.options.find_unused_parameters(true);
  const auto got = train_fsdp(make, options, run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 1e-6);
}

// ---- FSDP(checkpoint(block)) ---------------------------------------------

/// Applies activation checkpointing when fit starts (after the strategy's
/// setup installed its runner): checkpointing is then the outer layer.
class CheckpointAtFitStart : public strata::Callback {
 public:
  explicit CheckpointAtFitStart(strata::ActivationCheckpointOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "CheckpointAtFitStart"; }
  void on_fit_start(strata::Trainer&, strata::TrainingModule& m) override {
    strata::apply_activation_checkpointing(m, options_);
  }

 private:
  strata::ActivationCheckpointOptions options_;
};

void expect_checkpointing_changes_nothing(const std::string& model, const ModuleFactory& make) {
  const auto options = fsdp_test_options(2, 1, 0.0, 4).lr(1e-2).min_lr(1e-3).warmup_steps(1);
  FsdpRun plain;
  const auto reference = train_fsdp(make, options, plain);
  // The op policy keeps outputs in the forward and replays them in the
  // recompute, where FSDP has gathered the unit's parameters again.
  for (const auto& ac : {strata::ActivationCheckpointOptions().every_n(1), strata::ActivationCheckpointOptions().every_n(2),
                         strata::ActivationCheckpointOptions().policy("op")}) {
    SCOPED_TRACE(model + " every_n=" + std::to_string(ac.every_n()) + " policy=" + ac.policy());
    FsdpRun checkpointed;
    // Applied before the strategy's setup, so FSDP's runner is outermost.
    checkpointed.prepare = [ac](strata::TrainingModule& m, int) { strata::apply_activation_checkpointing(m, ac); };
    const auto got = train_fsdp(make, options, checkpointed);
    EXPECT_LE(max_param_diff(reference[0].params, got[0].params), 1e-6);
    EXPECT_LE(got[0].max_units_gathered, strata::FSDPStrategy::kMaxUnitsGathered);
    // checkpoint(FSDP(block)): applied after the strategy's setup, so the
    // recompute in backward runs FSDP's runner.
    FsdpRun outside;
    outside.callbacks = [ac](int) {
      return std::vector<std::shared_ptr<strata::Callback>>{std::make_shared<CheckpointAtFitStart>(ac)};
    };
    const auto got_outside = train_fsdp(make, options, outside);
    EXPECT_LE(max_param_diff(reference[0].params, got_outside[0].params), 1e-6) << "checkpoint outside FSDP";
    EXPECT_LE(got_outside[0].max_units_gathered, strata::FSDPStrategy::kMaxUnitsGathered);
    // Gathered as often as without checkpointing: the recompute's gather
    // serves the unit's backward too (no reshard, no prefetch in between).
    const auto all_gather = [](const Trained& t) { return t.result.comm_bytes[strata::CollectiveKind::kAllGather]; };
    EXPECT_EQ(all_gather(got_outside[0]), all_gather(reference[0]));
    EXPECT_EQ(all_gather(got[0]), all_gather(reference[0]));
  }
}

TEST(FsdpParityTest, ActivationCheckpointingInsideUnitsGivesTheSameParameters) {
  expect_checkpointing_changes_nothing("gpt-nano", gpt_nano());
  expect_checkpointing_changes_nothing("mlp-stack", [] {
    torch::manual_seed(12);
    return std::make_unique<strata::testing::MlpStackModule>(16, 24, 3);
  });
}

}  // namespace
