// fsdp_frozen_test - frozen parameters under FSDP (fully_sharded.h): sharded
// in gather-only FlatParams beside each unit's trainable one, never reduced
// or stepped. Frozen parts in the root, in units mixing both kinds, in whole
// units, in a unit whose input needs no gradient: each matches one process
// at two and three ranks, without reshard_after_forward, and with activation
// checkpointing inside and outside FSDP; frozen values stay bit-identical;
// the frozen parts are freed during backward (no more units gathered than
// limit_all_gathers allows); checkpoints carry frozen shards across strategies,
// offloaded ones too; a unit with frozen parts run twice in one forward is
// an error naming it.
#include "tests/strategies/fsdp/fsdp_harness.h"

#include "strata/strategies/activation_checkpoint.h"
#include "tests/run_binary.h"
#include "tests/mlp_stack.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

namespace {
using strata::FSDPOptions;
using strata::testing::FsdpRun;
using strata::testing::ModuleFactory;
using namespace strata::testing;

bool frozen_by(const std::string& name, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return false;
}

/// gpt_nano with every parameter whose name starts with one of `prefixes` frozen.
ModuleFactory nano_freezing(std::vector<std::string> prefixes) {
  return [prefixes] {
    auto module = gpt_nano()();
    int frozen = 0;
    for (auto& item : module->module().named_parameters()) {
      if (!frozen_by(item.key(), prefixes)) continue;
      item.value().set_requires_grad(false);
      ++frozen;
    }
    EXPECT_GT(frozen, 0) << "no parameter matched the prefixes";
    return module;
  };
}

struct Pattern {
  std::string what;
  std::vector<std::string> prefixes;
};

// mixed: the root mixes frozen wpe with trainable (tied) wte and ln_f; h0 is
// a unit of frozen parameters only, whose input needs a gradient (wte
// trains); h1 mixes a frozen MLP with a trainable attention.
// embeddings: the root holds frozen embeddings (trainable ln_f); h0 mixes,
// and its input needs no gradient; h2, the last unit, is frozen whole.
const std::vector<Pattern> kPatterns = {
    {"mixed", {"wpe.", "h0.", "h1.c_fc.", "h1.c_proj.", "h1.ln_2."}},
    {"embeddings", {"wte.", "wpe.", "h0.attn.", "h0.ln_1.", "h2."}},
};

/// Six AdamW steps against one process on the same global batch, with the
/// tolerances of fsdp_test's expect_parity; frozen parameters bit-identical.
void expect_parity(const Pattern& pattern, FsdpRun run) {
  SCOPED_TRACE(pattern.what + " world " + std::to_string(run.world));
  const int64_t per_rank_batch = 2, steps = 6;
  const auto make = nano_freezing(pattern.prefixes);
  auto initial_module = make();
  const auto initial = clone_params(*initial_module);
  std::vector<bool> frozen;
  for (const auto& p : initial_module->module().parameters()) frozen.push_back(!p.requires_grad());
  const auto reference = train_single(make, fsdp_test_options(per_rank_batch * run.world, 1, 0.0, steps));
  const auto got = train_fsdp(make, fsdp_test_options(per_rank_batch, 1, 0.0, steps), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 3e-5);
  ASSERT_EQ(reference.grad_norms.size(), got[0].grad_norms.size());
  for (size_t s = 0; s < reference.grad_norms.size(); ++s) {
    EXPECT_NEAR(got[0].grad_norms[s], reference.grad_norms[s], 1e-5 * reference.grad_norms[s]) << "step " << s + 1;
  }
  bool trained = false;
  for (size_t i = 0; i < initial.size(); ++i) {
    if (frozen[i]) {
      EXPECT_TRUE(torch::equal(got[0].params[i], initial[i])) << "frozen param " << i << " moved";
    } else {
      trained = trained || !torch::equal(got[0].params[i], initial[i]);
    }
  }
  EXPECT_TRUE(trained) << "no trainable parameter moved";
  // Without reshard_after_forward every unit stays gathered from forward on.
  if (run.options.reshard_after_forward().value_or(true)) {
    EXPECT_LE(got[0].max_units_gathered, strata::FSDPStrategy::kMaxUnitsGathered);
  }
}

TEST(FsdpFrozenTest, FrozenPartsAnywhereMatchSingleProcessAtTwoAndThreeRanks) {
  for (const auto& pattern : kPatterns) {
    for (int world : {2, 3}) {
      FsdpRun run;
      run.world = world;
      expect_parity(pattern, run);
    }
    FsdpRun keep;
    keep.world = 3;
    keep.options = FSDPOptions().reshard_after_forward(false);
    expect_parity(pattern, keep);
  }
}

TEST(FsdpFrozenTest, FrozenPartsMatchWithActivationCheckpointingInsideAndOutsideFsdp) {
  for (const auto& pattern : kPatterns) {
    FsdpRun inside;  // FSDP(checkpoint(block)): applied before the strategy's setup
    inside.prepare = [](strata::TrainingModule& m, int) {
      strata::apply_activation_checkpointing(m, strata::ActivationCheckpointOptions().every_n(1));
    };
    expect_parity(pattern, inside);
    FsdpRun outside;  // checkpoint(FSDP(block)): the recompute in backward runs FSDP's runner
    struct AtFitStart : strata::Callback {
      std::string name() const override { return "AtFitStart"; }
      void on_fit_start(strata::Trainer&, strata::TrainingModule& m) override {
        strata::apply_activation_checkpointing(m, strata::ActivationCheckpointOptions().every_n(1));
      }
    };
    outside.callbacks = [](int) {
      return std::vector<std::shared_ptr<strata::Callback>>{std::make_shared<AtFitStart>()};
    };
    expect_parity(pattern, outside);
  }
}

/// MlpStackModule whose training step runs block 0 twice (a shared layer).
class BlockZeroTwice : public strata::testing::MlpStackModule {
 public:
  using MlpStackModule::MlpStackModule;
  torch::Tensor training_step(const strata::Batch& batch) override {
    auto x = net().embed(batch.input);
    for (const int64_t unit : {int64_t{0}, int64_t{0}, int64_t{1}}) {
      x = run_unit(unit, x, [block = net().blocks[unit].ptr()](const torch::Tensor& t) { return block->forward(t); });
    }
    const auto logits = net().head(x);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.target.reshape({-1}));
  }
};

TEST(FsdpFrozenTest, AUnitWithFrozenPartsRunTwiceInOneForwardIsAnErrorNamingIt) {
  // Its frozen part is freed when the first run's input gradient arrives;
  // the second run's backward would then read freed weights.
  const ModuleFactory make = [] {
    torch::manual_seed(5);
    auto module = std::make_unique<BlockZeroTwice>(16, 8, 2);
    for (auto& item : module->module().named_parameters()) {
      if (item.key().rfind("block0.fc1.", 0) == 0) item.value().set_requires_grad(false);
    }
    return module;
  };
  try {
    train_fsdp(make, fsdp_test_options(2, 1, 0.0, 1), FsdpRun{});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("wrap unit 0 ran twice in one forward"), std::string::npos) << message;
  }
}

TEST(FsdpFrozenTest, LoraUnitsFreeTheirFrozenPartDuringBackwardAndHoldOnlyShards) {
  // Every block mixes frozen base weights with trainable adapters. Were the
  // frozen parts kept until backward ends, all three blocks would be held at
  // once; freed after each unit's input gradient, at most two are.
  const auto options = strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false)
                           .lora_rank(4).lora_targets("attn,mlp");
  const ModuleFactory make = [options] {
    torch::manual_seed(11);
    return std::make_unique<strata::recipes::GPTModule>(options);
  };
  auto probe = make();
  int64_t frozen = 0, trainable = 0;
  for (const auto& p : probe->module().parameters()) (p.requires_grad() ? trainable : frozen) += p.numel();
  const auto reference = train_single(make, fsdp_test_options(4, 1, 0.0, 4));
  FsdpRun run;
  const auto got = train_fsdp(make, fsdp_test_options(2, 1, 0.0, 4), run);
  EXPECT_LE(max_param_diff(reference.params, got[0].params), 3e-5);
  EXPECT_EQ(got[0].max_units_gathered, 2);
  // Between steps: this rank's shards of both kinds (a few padding elements).
  const auto& state = got[0].result.model_state_bytes[0];
  EXPECT_NEAR(static_cast<double>(state.params), 4.0 * (frozen + trainable) / 2, 4 * 16) << "frozen " << frozen;
}

TEST(FsdpFrozenTest, FrozenShardsTravelThroughCheckpointsAcrossStrategies) {
  // strata-gpt with LoRA: four steps under one strategy, a checkpoint, four
  // more resumed under another; the parameters equal eight straight steps
  // (a constant learning rate: the first run's max_steps sets no schedule).
  strata::testing::TempDir dir("strata-fsdp-frozen");
  auto run = [&](const std::string& tag, const std::string& flags) {
    const std::string args = "--preset gpt-nano --data addition:2 --warmup-steps 1 --bias false --dropout 0 "
                             "--lora-rank 4 --lora-targets attn,mlp --optimizer adamw --lr 0.01 --min-lr 0.01 "
                             "--gradient-clip-val 0 --threads-per-rank 1 --limit-val-batches 0 "
                             "--log-every-n-steps 100 --progress-bar false --output-dir " + dir.file(tag) + " " + flags;
    return run_gpt_binary(args);
  };
  const std::string single = "--strategy single --batch-size 8 ", fsdp = "--strategy fsdp --nproc 2 --batch-size 4 ";
  // The frozen base offloaded too (QLoRA-style memory): its shards stream
  // from the tier into the checkpoint.
  const std::string fsdp_offload = fsdp + "--offload disk --offload-dir " + dir.path().string() + " ";
  auto straight = run("straight", single + "--max-steps 8 --dump-params " + dir.file("straight.pt"));
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto want = load_archive(dir.file("straight.pt"));
  const std::vector<std::pair<std::string, std::string>> pairs = {{fsdp, single}, {single, fsdp}, {fsdp_offload, single}};
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto& [from, to] = pairs[i];
    const std::string tag = std::vector<std::string>{"fsdp-single", "single-fsdp", "fsdp-offload-single"}[i];
    SCOPED_TRACE(tag);
    auto first = run(tag, from + "--max-steps 4 --checkpoint-every 4");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    auto second = run(tag, to + "--max-steps 8 --resume last --dump-params " + dir.file(tag + ".pt"));
    ASSERT_EQ(second.exit_code, 0) << second.output;
    const auto got = load_archive(dir.file(tag + ".pt"));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, value] : want) {
      EXPECT_LE((value - got.at(name)).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

}  // namespace
