// fsdp_mechanics_test - what FSDP holds and sends, ranks as threads: the
// FlatParam's free-in-place reshard, model state against the ZeRO-3 formula,
// bytes sent per step against 3Ψ, weight-decay groups through flattening,
// validation, options, and a failing rank ending every rank.
#include "tests/strategies/fsdp/fsdp_harness.h"

#include "strata/strategies/fsdp/flat_param.h"
#include "strata/strategies/registry.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <sstream>

namespace {
using strata::FSDPOptions;
using strata::FSDPStrategy;
using strata::ShardingStrategy;
using namespace strata::testing;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Elements per FSDP unit of gpt_nano() under the block policy: the three
/// blocks, then the root (embeddings and final norm; the head is tied).
std::vector<int64_t> nano_unit_numels() {
  auto module = gpt_nano()();
  std::vector<int64_t> units;
  int64_t in_units = 0, total = 0;
  for (const auto& unit : module->wrap_units()) {
    int64_t n = 0;
    for (const auto& p : unit->parameters()) n += p.numel();
    units.push_back(n);
    in_units += n;
  }
  for (const auto& p : module->module().parameters()) total += p.numel();
  units.push_back(total - in_units);
  return units;
}

TEST(FlatParamTest, ReshardFreesTheStorageBackwardSavedAndGatherRefillsIt) {
  strata::run_thread_world(2, [](strata::Comm& comm) {
    torch::nn::Linear lin{nullptr};
    torch::nn::LayerNorm ln{nullptr};
    torch::Tensor x, w;
    {
      static std::mutex init;
      std::lock_guard<std::mutex> lock(init);
      torch::manual_seed(3);
      lin = torch::nn::Linear(torch::nn::LinearOptions(4, 3).bias(false));
      ln = torch::nn::LayerNorm(torch::nn::LayerNormOptions({3}));
      x = torch::randn({2, 5, 4});
      w = torch::randn({2, 5, 3});
    }
    auto loss_of = [&] { return (ln(lin(x)) * w).sum(); };
    loss_of().backward();
    std::vector<torch::Tensor> params{lin->weight, ln->weight, ln->bias}, expected;
    for (auto& p : params) {
      expected.push_back(p.grad().clone());
      p.mutable_grad() = torch::Tensor();
    }
    strata::FlatParam flat("unit", params, {"lin.weight", "ln.weight", "ln.bias"}, 2, comm.rank());
    const int64_t shard_bytes = 4 * flat.layout().shard_numel();
    EXPECT_EQ(flat.layout().padded_numel(), 18);  // 12 + 3 + 3
    flat.reshard();
    EXPECT_EQ(lin->weight.numel(), 0);
    EXPECT_EQ(lin->weight.dim(), 2);  // dims kept: optimizer groups may look at them
    EXPECT_EQ(flat.param_bytes(), shard_bytes);

    flat.finish_gather(comm);
    auto seen_by_backward = lin->weight.data();  // as a saved weight.t() would
    auto loss = loss_of();
    flat.reshard();  // between forward and backward, as reshard_after_forward does
    // The full buffer is gone even for views taken during forward.
    EXPECT_EQ(seen_by_backward.storage().nbytes(), 0u);
    EXPECT_EQ(flat.param_bytes(), shard_bytes);

    flat.finish_gather(comm);  // into the same storage, so the saved views see it
    flat.prepare_grads();
    loss.backward();
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_TRUE(torch::allclose(params[k].grad(), expected[k], 1e-6, 1e-6)) << "param " << k;
    }
  });
}

TEST(FsdpMemoryTest, ModelStateIsSixteenPsiOverNPlusPadding) {
  const auto units = nano_unit_numels();
  int64_t psi = 0;
  for (int64_t n : units) psi += n;
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    FsdpRun run;
    run.world = world;
    const auto got = train_fsdp(gpt_nano(), fsdp_test_options(2, 1, 0.0, 2), run);
    int64_t shard_total = 0;  // this rank's shard elements over all units, padding included
    for (int64_t n : units) shard_total += ceil_div(n, world);
    int64_t optimizer_sum = 0;
    for (int r = 0; r < world; ++r) {
      const auto& state = got[0].result.model_state_bytes[r];  // measured after step 1's optimizer step
      EXPECT_EQ(state.params, 4 * shard_total) << "rank " << r;
      EXPECT_EQ(state.grads, 4 * shard_total) << "rank " << r;
      // AdamW's two moments of this rank's real elements, none for padding:
      // unit n's shard r covers [r*c, (r+1)*c) with c = ceil(n/N), cut at n.
      int64_t real = 0;
      for (int64_t n : units) {
        const int64_t c = ceil_div(n, world);
        real += std::max<int64_t>(0, std::min(n, (r + 1) * c) - r * c);
      }
      EXPECT_EQ(state.optimizer, 8 * real) << "rank " << r;
      optimizer_sum += state.optimizer;
      const double formula = 16.0 * static_cast<double>(psi) / world;
      EXPECT_NEAR(static_cast<double>(state.total()), formula, 0.02 * formula) << "rank " << r;
      std::cout << "[ fsdp memory ] world " << world << " rank " << r << ": params " << state.params
                << " grads " << state.grads << " optimizer " << state.optimizer << " total "
                << state.total() << " B; 16Ψ'/N = " << formula << " B (Ψ' = " << psi << ")\n";
    }
    EXPECT_EQ(optimizer_sum, 8 * psi);  // every real element's Adam state on exactly one rank
    for (const auto& rank : got) EXPECT_EQ(rank.max_units_gathered, FSDPStrategy::kMaxUnitsGathered);
  }
  // shard_grad_op keeps every unit gathered from its forward to its backward.
  FsdpRun keep;
  keep.options.sharding_strategy(ShardingStrategy::kShardGradOp);
  const auto got = train_fsdp(gpt_nano(), fsdp_test_options(2, 1, 0.0, 2), keep);
  EXPECT_EQ(got[0].max_units_gathered, 3);
}

/// Bytes this rank's Comm sent during step 2, per collective kind.
class StepBytes : public strata::Callback {
 public:
  std::string name() const override { return "StepBytes"; }
  void on_train_batch_start(strata::Trainer& t, strata::TrainingModule&, int64_t step) override {
    if (step == 2) before = t.strategy().comm().bytes();
  }
  void on_train_batch_end(strata::Trainer& t, strata::TrainingModule&, const strata::StepMetrics& m) override {
    if (m.step == 2) after = t.strategy().comm().bytes();
  }
  int64_t sent(strata::CollectiveKind kind) const { return after[kind] - before[kind]; }
  strata::CommBytes before, after;
};

TEST(FsdpCommTest, AllGathersUnitsTwiceButTheLastAndTheRootAndReduceScattersOnePsiPerStep) {
  const auto units = nano_unit_numels();  // the wrap units in order, then the root
  int64_t psi = 0;
  for (int64_t n : units) psi += n;
  const size_t last = units.size() - 2;  // the last wrap unit
  for (int world : {2, 3}) {
    // Unset (auto): the last unit is kept from its forward to its backward,
    // as torchtitan does; true: it is freed and gathered again, as every unit.
    for (const bool always : {false, true}) {
      std::vector<std::shared_ptr<StepBytes>> bytes;
      for (int r = 0; r < world; ++r) bytes.push_back(std::make_shared<StepBytes>());
      FsdpRun run;
      run.world = world;
      if (always) run.options = FSDPOptions().reshard_after_forward(true);
      run.callbacks = [&](int rank) { return std::vector<std::shared_ptr<strata::Callback>>{bytes[rank]}; };
      train_fsdp(gpt_nano(), fsdp_test_options(2, 1, 0.0, 3), run);
      // Wrap units are gathered for forward and again for backward; the root
      // once (kept from forward to its backward). Every unit reduce-scattered once.
      int64_t gathered = 0, reduced = 0;
      for (size_t u = 0; u < units.size(); ++u) {
        const int64_t shard = ceil_div(units[u], world);
        const bool once = u == units.size() - 1 || (u == last && !always);
        gathered += (once ? 1 : 2) * shard;
        reduced += shard;
      }
      const double psi_share = 4.0 * static_cast<double>(psi) * (world - 1) / world;  // Ψ·(N-1)/N
      for (int r = 0; r < world; ++r) {
        SCOPED_TRACE("world " + std::to_string(world) + " rank " + std::to_string(r) +
                     (always ? " reshard_after_forward=true" : " auto"));
        const int64_t ag = bytes[r]->sent(strata::CollectiveKind::kAllGather);
        const int64_t rs = bytes[r]->sent(strata::CollectiveKind::kReduceScatter);
        EXPECT_EQ(ag, 4 * (world - 1) * gathered);
        EXPECT_EQ(rs, 4 * (world - 1) * reduced);
        EXPECT_NEAR(rs / psi_share, 1.0, 0.01);
        if (r == 0) {
          std::cout << "[ fsdp bytes ] world " << world << (always ? " always" : " auto") << ": all-gather "
                    << ag << " B = " << ag / psi_share << " x Ψ(N-1)/N, reduce-scatter " << rs << " B = "
                    << rs / psi_share << " x Ψ(N-1)/N (Ψ = " << 4 * psi << " B)\n";
        }
      }
    }
  }
}

TEST(FsdpOptimizerTest, WeightDecayChoiceSurvivesFlattening) {
  auto reference = gpt_nano()();
  int64_t decay = 0, no_decay = 0;
  for (const auto& p : reference->module().parameters()) (p.dim() >= 2 ? decay : no_decay) += p.numel();
  std::vector<std::unique_ptr<strata::TrainingModule>> modules;
  for (int r = 0; r < 3; ++r) modules.push_back(gpt_nano()());
  strata::run_thread_world(3, [&](strata::Comm& comm) {
    auto& module = *modules[comm.rank()];
    FSDPStrategy fsdp(comm);
    fsdp.setup(module);
    const strata::TrainerOptions options;
    // After setup, as the Trainer does: groups are built from resharded parameters.
    auto optimizer = fsdp.setup_optimizer(strata::make_optimizer_groups(module.module(), options),
                                          strata::optimizer_factory(options));
    auto counts = torch::zeros({2}, torch::kInt64);
    for (const auto& group : optimizer->param_groups()) {
      const double wd = static_cast<const torch::optim::AdamWOptions&>(group.options()).weight_decay();
      for (const auto& p : group.params()) counts[wd > 0 ? 0 : 1] += p.numel();
    }
    comm.all_reduce(counts);
    EXPECT_EQ(counts[0].item<int64_t>(), decay);
    EXPECT_EQ(counts[1].item<int64_t>(), no_decay);
  });
}

TEST(FsdpParityTest, ValidationMatchesSingleProcess) {
  auto options = fsdp_test_options(4, 1, 0.0, 3).limit_val_batches(2);
  const auto reference = train_single(gpt_nano(), options);
  FsdpRun run;
  const auto got = train_fsdp(gpt_nano(), options.batch_size(2), run);
  ASSERT_TRUE(reference.result.val_loss && got[0].result.val_loss);
  EXPECT_NEAR(*got[0].result.val_loss, *reference.result.val_loss, 1e-5);
}

/// At step 3: records the module's FLOPs estimate, saves a checkpoint, stops.
class SaveAndStopAtThree : public strata::Callback {
 public:
  explicit SaveAndStopAtThree(std::string dir) : dir_(std::move(dir)) {}
  std::string name() const override { return "SaveAndStopAtThree"; }
  void on_train_batch_end(strata::Trainer& t, strata::TrainingModule& m, const strata::StepMetrics& metrics) override {
    flops_per_token = m.flops_per_token();
    if (metrics.step != 3) return;
    t.save_checkpoint(dir_);
    t.request_stop("test");
  }
  double flops_per_token = 0.0;

 private:
  std::string dir_;
};

TEST(FsdpCheckpointTest, ResumeReproducesTheUninterruptedRun) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata-fsdp-ckpt-" + std::to_string(::getpid()));
  const auto options = fsdp_test_options(2, 1, 0.0, 6);
  const auto straight = train_fsdp(gpt_nano(), options, FsdpRun{});
  std::vector<std::shared_ptr<SaveAndStopAtThree>> savers;
  for (int r = 0; r < 2; ++r) savers.push_back(std::make_shared<SaveAndStopAtThree>(dir.string()));
  FsdpRun first;
  first.callbacks = [&](int rank) { return std::vector<std::shared_ptr<strata::Callback>>{savers[rank]}; };
  train_fsdp(gpt_nano(), options, first);
  // The checkpoint records full shapes, not the 0-element resharded ones.
  std::ifstream metadata(dir / "metadata.json");
  const auto doc = nlohmann::json::parse(metadata);
  EXPECT_EQ(doc["body"]["tensors"]["model/wte.weight"]["shape"], nlohmann::json::array({16, 48}));
  EXPECT_EQ(doc["body"]["meta"]["format"], "sharded");  // fsdp's default
  // The model's size (FLOPs estimate, parameter count) does not shrink with its shards.
  for (const auto& saver : savers) EXPECT_EQ(saver->flops_per_token, gpt_nano()()->flops_per_token());

  const ModuleFactory other_init = [] {
    torch::manual_seed(99);  // everything must come from the checkpoint
    return std::make_unique<strata::recipes::GPTModule>(
        strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false));
  };
  const auto resumed = train_fsdp(other_init, strata::TrainerOptions(options).resume_from(dir.string()), FsdpRun{});
  EXPECT_EQ(resumed[0].result.steps, 6);
  EXPECT_LE(max_param_diff(straight[0].params, resumed[0].params), 1e-6);
  std::filesystem::remove_all(dir);
}

TEST(FsdpOptionsTest, SummonedParametersAreKeptOnlyWithWriteback) {
  std::vector<std::unique_ptr<strata::TrainingModule>> modules;
  for (int r = 0; r < 3; ++r) modules.push_back(gpt_nano()());
  strata::run_thread_world(3, [&](strata::Comm& comm) {
    auto& module = *modules[comm.rank()];
    FSDPStrategy fsdp(comm);
    fsdp.setup(module);
    torch::NoGradGuard no_grad;
    auto fill = [&](double value, bool writeback) {
      auto full = fsdp.summon_full_params(writeback);
      for (auto& p : module.module().parameters()) p.fill_(value);
    };
    auto all_equal = [&](double value) {
      auto full = fsdp.summon_full_params();
      bool same = true;
      for (const auto& p : module.module().parameters()) same = same && p.numel() > 0 && p.eq(value).all().item<bool>();
      return same;
    };
    fill(0.5, true);
    EXPECT_TRUE(all_equal(0.5));
    fill(1.5, false);
    EXPECT_TRUE(all_equal(0.5));
    EXPECT_EQ(module.module().parameters().front().numel(), 0);  // resharded again
  });
}

TEST(FsdpOptionsTest, ContradictionsAndUnknownNamesAreErrorsNamingTheValues) {
  try {
    FSDPStrategy(strata::Comm(), FSDPOptions().sharding_strategy(ShardingStrategy::kShardGradOp).reshard_after_forward(true));
    FAIL() << "accepted shard_grad_op with reshard_after_forward=true";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("reshard_after_forward=true"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shard_grad_op"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(FSDPStrategy(strata::Comm(), FSDPOptions().reshard_after_forward(false)));
  for (const auto& name : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}) {
    EXPECT_EQ(strata::to_string(strata::parse_sharding_strategy(name)), name);
  }
  try {
    strata::parse_sharding_strategy("hybrid");
    FAIL();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("'hybrid'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("full_shard, shard_grad_op, no_shard, hybrid_shard"), std::string::npos) << msg;
  }
  EXPECT_EQ(strata::parse_wrap_policy("none"), strata::WrapPolicy::kNone);
  EXPECT_THROW(strata::parse_wrap_policy("size"), c10::Error);
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  EXPECT_EQ(registry.resolve("zero3"), "fsdp");
  EXPECT_EQ(registry.create("zero3", strata::Comm())->name(), "fsdp");
}

TEST(FsdpErrorTest, RankFailingAroundAUnitGatherEndsEveryRankNotAHang) {
  // Rank 1 fails at unit 1: (inside) after FSDP gathered it and started
  // prefetching unit 2, or (outside) before FSDP's runner sees it, so rank 1
  // never issues unit 2's all-gather that rank 0 waits for.
  for (const bool inside : {true, false}) {
    SCOPED_TRACE(inside ? "inside" : "outside");
    const strata::UnitRunner fail = [](int64_t unit, const torch::Tensor& x, const strata::UnitFn& f) {
      TORCH_CHECK(unit != 1, "injected failure at unit 1");
      return f(x);
    };
    std::vector<std::unique_ptr<strata::TrainingModule>> modules;
    for (int r = 0; r < 2; ++r) modules.push_back(gpt_nano()());
    if (inside) modules[1]->add_unit_runner(fail);  // before FSDP's setup: innermost
    std::mutex mu;
    std::vector<std::string> errors(2);
    // Far above the bound below: a rank 0 that hung until the timeout freed
    // it would fail the bound (measured: every rank ends in ~0.07 s, when
    // rank 1's closed connection resets rank 0's pending all-gather).
    const auto timeout = std::chrono::seconds(60);
    const auto start = std::chrono::steady_clock::now();
    strata::run_thread_world(2, [&](strata::Comm& comm) {
      auto& module = *modules[comm.rank()];
      try {
        auto fsdp = std::make_shared<FSDPStrategy>(comm);
        fsdp->setup(module);  // by hand: the outer runner below must come after FSDP's
        if (!inside && comm.rank() == 1) module.add_unit_runner(fail);  // outermost
        strata::testing::ToyData data;
        for (int64_t step = 0; step < 3; ++step) {
          auto loss = fsdp->training_step(module, data.train_batch(step, 2, {comm.rank(), 2}));
          fsdp->backward(loss);
          fsdp->reduce_gradients();
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors[comm.rank()] = e.what();
      }
    }, timeout);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(errors[1].find("injected failure at unit 1"), std::string::npos) << errors[1];
    EXPECT_FALSE(errors[0].empty()) << "rank 0 finished although rank 1 failed";
    EXPECT_LT(elapsed, 10.0) << "rank 0 waited " << elapsed << " s";
    std::cout << "[ fsdp failure ] " << (inside ? "inside" : "outside") << ": every rank ended after "
              << elapsed << " s; rank 0: " << errors[0].substr(0, errors[0].find('\n')) << "\n";
  }
}

TEST(FsdpReportTest, DescribeListsEveryUnitWithItsShardAndThePerRankModelState) {
  // gpt_nano at world 3: every unit's elements, padding to a multiple of 3
  // and the per-rank shard, then AdamW's 16 bytes per shard element.
  const auto units = nano_unit_numels();
  std::vector<std::string> text(3);
  std::vector<std::map<std::string, double>> reports(3);
  std::vector<std::unique_ptr<strata::TrainingModule>> modules;
  for (int r = 0; r < 3; ++r) modules.push_back(gpt_nano()());
  strata::run_thread_world(3, [&](strata::Comm& comm) {
    auto fsdp = std::make_shared<FSDPStrategy>(comm);
    fsdp->setup(*modules[comm.rank()]);
    text[comm.rank()] = fsdp->describe();
    reports[comm.rank()] = fsdp->report();
  }, std::chrono::seconds(30));
  std::cout << "[ fsdp describe ] " << text[0] << "\n";
  int64_t shard_total = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t shard = ceil_div(units[u], 3);
    shard_total += shard;
    const std::string line = ": " + std::to_string(units[u]) + " parameter elements in ";
    EXPECT_NE(text[0].find(line), std::string::npos) << "unit " << u << ": " << text[0];
    const std::string tail = ", padding " + std::to_string(3 * shard - units[u]) + ", shard " +
                             std::to_string(shard) + " per rank";
    EXPECT_NE(text[0].find(tail), std::string::npos) << "unit " << u << ": " << text[0];
  }
  EXPECT_NE(text[0].find("\n  unit root: "), std::string::npos) << text[0];
  // The header, one line per unit, and the model-state line (the most units
  // gathered at once is reported in summary.json, after training).
  EXPECT_EQ(std::count(text[0].begin(), text[0].end(), '\n'), static_cast<long>(units.size()) + 1) << text[0];
  std::ostringstream total;
  total << "(total " << 16 * shard_total / (1024.0 * 1024.0) << " MiB)";
  EXPECT_NE(text[0].find("per-rank model state with AdamW: "), std::string::npos) << text[0];
  EXPECT_NE(text[0].find(total.str()), std::string::npos) << total.str() << "\n" << text[0];
  for (const auto& report : reports) {
    ASSERT_EQ(report.count("max_units_gathered"), 1u);
    EXPECT_EQ(report.at("max_units_gathered"), 0.0);  // nothing has run yet
  }
}

}  // namespace
