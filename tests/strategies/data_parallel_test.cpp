// What DDP, OSS and SDP share, against single-process training with ranks as
// threads (a HashStore and one Gloo group per thread): FusedAdamW under every
// strategy, bucket sizes, the ZeRO state formulas, errors that must not hang,
// a second fit with one strategy object, unused parameters, mixed dtypes. Each
// strategy's own parity is in tests/strategies/<name>/; the multi-process
// parity through the real launcher in tests/strategies/parity_test.cpp.
#include "strata/kernels/fused_adamw_optimizer.h"
#include "strata/strategies/ddp/ddp.h"
#include "strata/strategies/oss/oss.h"
#include "strata/strategies/sdp/sdp.h"
#include "tests/strategies/data_parallel_harness.h"

#include <algorithm>
#include <functional>

namespace {
using namespace strata::testing::data_parallel;

/// Checks after every step that the Trainer's optimizer is a FusedAdamW whose
/// every parameter (the strategy's flat-shard views included) took the
/// fused kernel asked for, never the fallback.
class ExpectFusedSteps : public strata::Callback {
 public:
  explicit ExpectFusedSteps(strata::FusedAdamWKernel kernel) : kernel_(kernel) {}
  std::string name() const override { return "ExpectFusedSteps"; }
  void on_train_batch_end(strata::Trainer& trainer, strata::TrainingModule&, const strata::StepMetrics&) override {
    const auto* fused = dynamic_cast<const strata::FusedAdamW*>(trainer.optimizer());
    ASSERT_NE(fused, nullptr);
    EXPECT_GT(fused->fused_steps(), 0);
    EXPECT_EQ(fused->fallback_steps(), 0);
    EXPECT_EQ(fused->kernel(), kernel_);
  }

 private:
  strata::FusedAdamWKernel kernel_;
};

TEST(FusedAdamWStrategyTest, MatchesTorchAdamWOver100StepsUnderEveryStrategy) {
  // The same run with FusedAdamW and with torch::optim::AdamW, per strategy:
  // nanoGPT's decay/no-decay groups, per-group lr from the schedule, and the
  // sharded strategies' 1-D views of flat shards.
  const int64_t steps = 100;
  for (const std::string strategy : {"single", "ddp", "oss", "sdp", "fsdp"}) {
    const int world = strategy == "single" ? 1 : 2;
    const auto options = options_for(2, 1, 1.0, steps);
    // 0: torch::optim::AdamW, 1: FusedAdamW with strata's kernel, 2: with ATen's.
    std::vector<torch::Tensor> results[3];
    for (const int variant : {0, 1, 2}) {
      const bool fused = variant > 0;
      const auto kernel = variant == 2 ? strata::FusedAdamWKernel::kAten : strata::FusedAdamWKernel::kStrata;
      std::mutex mu;
      strata::StrategyRegistry registry;
      strata::register_builtin_strategies(registry);
      strata::run_thread_world(world, [&](strata::Comm& comm) {
        auto module = make_module();
        strata::testing::ToyData data;
        std::vector<std::shared_ptr<strata::Callback>> callbacks;
        if (fused) callbacks.push_back(std::make_shared<ExpectFusedSteps>(kernel));
        std::shared_ptr<strata::Strategy> strat = registry.create(strategy, comm);
        strata::Trainer(strata::TrainerOptions(options).fused_adamw(fused).fused_adamw_kernel(kernel), strat,
                        callbacks)
            .fit(module, data);
        const auto full = strat->full_params();  // FSDP: the module holds only shards otherwise
        std::lock_guard<std::mutex> lock(mu);
        if (comm.rank() != 0) return;
        for (const auto& p : module.module().parameters()) results[variant].push_back(p.detach().clone());
      }, std::chrono::seconds(120));
    }
    ASSERT_FALSE(results[0].empty()) << strategy;
    for (const int variant : {1, 2}) {
      ASSERT_EQ(results[0].size(), results[variant].size()) << strategy << " variant " << variant;
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_TRUE(torch::allclose(results[variant][i], results[0][i], 1e-6, 1e-6))
            << strategy << (variant == 2 ? " aten" : " strata") << " param " << i << " max abs diff "
            << (results[variant][i] - results[0][i]).abs().max().item<double>();
      }
    }
  }
}


TEST(GradientScaleTest, TwiceTheUpdateIsFarOutsideTheTolerance) {
  // Control: the 1e-5 parameter tolerance separates a 2x update (lr doubled,
  // which is what a 2x gradient does to SGD before weight decay) by a wide margin.
  const Trained reference = train_single(sgd_options(4, 1));
  const Trained doubled = train_single(sgd_options(4, 1).lr(2 * kSgdLr).min_lr(2 * kSgdLr / 10));
  double worst = 0.0;
  for (size_t i = 0; i < reference.params.size(); ++i) {
    worst = std::max(worst, (reference.params[i] - doubled.params[i]).abs().max().item<double>());
  }
  EXPECT_GT(worst, 1e-3);
}

TEST(StrategyParityTest, SmallBucketsGiveTheSameResult) {
  // Many buckets (a few KiB each) exercise bucket ordering and in-flight limits;
  // a DDP cap of 0 is one all-reduce per gradient, overlapped or after backward.
  const int64_t steps = 5;
  auto reference = train_single(6, 1, 0.0, steps);
  using Factory = std::function<std::shared_ptr<strata::Strategy>(strata::Comm&)>;
  const std::vector<std::pair<std::string, Factory>> variants = {
      {"ddp 4 KiB buckets",
       [](strata::Comm& c) { return std::make_shared<strata::DDPStrategy>(c, strata::DDPOptions().bucket_cap_mb(0.004)); }},
      {"ddp per gradient",
       [](strata::Comm& c) { return std::make_shared<strata::DDPStrategy>(c, strata::DDPOptions().bucket_cap_mb(0)); }},
      {"ddp per gradient after backward",
       [](strata::Comm& c) {
         return std::make_shared<strata::DDPStrategy>(c, strata::DDPOptions().bucket_cap_mb(0).overlap_comm(false));
       }},
      {"sdp 4 KiB buckets",
       [](strata::Comm& c) { return std::make_shared<strata::SDPStrategy>(c, strata::ShardOptions().bucket_cap_mb(0.004)); }},
  };
  for (const auto& [name, make] : variants) {
    std::mutex mu;
    std::vector<torch::Tensor> got;
    strata::run_thread_world(3, [&](strata::Comm& comm) {
      auto module = make_module();
      strata::testing::ToyData data;
      strata::Trainer(options_for(2, 1, 0.0, steps), make(comm)).fit(module, data);
      if (comm.rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& p : module.module().parameters()) got.push_back(p.detach().clone());
      }
    }, std::chrono::seconds(30));
    ASSERT_EQ(got.size(), reference.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE((reference[i] - got[i]).abs().max().item<double>(), 1e-5) << name << " param " << i;
    }
  }
}

TEST(StrategyMemoryTest, ShardedStateMatchesZeroFormulas) {
  for (int world : {2, 3, 4}) {
    std::mutex mu;
    std::vector<strata::ModelStateBytes> oss(world), sdp(world);
    std::vector<int64_t> shard_numel(world);
    int64_t n_params = 0;
    for (const std::string name : {"oss", "sdp"}) {
      strata::run_thread_world(world, [&](strata::Comm& comm) {
        auto module = make_module();
        strata::testing::ToyData data;
        strata::StrategyRegistry registry;
        strata::register_builtin_strategies(registry);
        std::shared_ptr<strata::Strategy> s = registry.create(name, comm);
        auto result = strata::Trainer(options_for(2, 1, 0.0, 2), s).fit(module, data);
        std::lock_guard<std::mutex> lock(mu);
        (name == "oss" ? oss : sdp)[comm.rank()] = result.model_state_bytes[comm.rank()];
        shard_numel[comm.rank()] = static_cast<strata::OSSStrategy&>(*s).layout().shard_numel();
        n_params = module.model()->num_params();
      }, std::chrono::seconds(30));
    }
    const int64_t p = shard_numel[0];
    EXPECT_EQ(p, (n_params + world - 1) / world);
    for (int r = 0; r < world; ++r) {
      // Flat buffers are padded to a multiple of the world size.
      const int64_t padded = p * world;
      EXPECT_EQ(oss[r].params, 4 * padded) << "world " << world;
      EXPECT_EQ(oss[r].grads, 4 * padded) << "world " << world;       // full gradients (ZeRO-1)
      EXPECT_EQ(oss[r].optimizer, 8 * p) << "world " << world;        // exp_avg + exp_avg_sq of the shard
      EXPECT_EQ(sdp[r].params, 4 * padded) << "world " << world;
      EXPECT_EQ(sdp[r].grads, 4 * p) << "world " << world;            // owned gradient shard only (ZeRO-2)
      EXPECT_EQ(sdp[r].optimizer, 8 * p) << "world " << world;
    }
  }
}

TEST(StrategyErrorTest, UnusedParameterIsNamedNotAHang) {
  // A module with a parameter the loss never touches.
  class WithUnused : public strata::TrainingModule {
   public:
    WithUnused() : net_(std::make_shared<torch::nn::Module>()) {
      used_ = net_->register_parameter("used", torch::randn({4}));
      net_->register_parameter("unused", torch::randn({4}));
    }
    torch::nn::Module& module() override { return *net_; }
    torch::Tensor training_step(const strata::Batch& b) override {
      return (used_ * b.input.to(torch::kFloat32).narrow(1, 0, 4)).sum();
    }
    strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

   private:
    std::shared_ptr<torch::nn::Module> net_;
    torch::Tensor used_;
  };
  for (const std::string name : {"ddp", "sdp"}) {
    std::mutex mu;
    std::vector<std::string> errors;
    strata::run_thread_world(2, [&](strata::Comm& comm) {
      WithUnused module;
      strata::testing::ToyData data;
      strata::StrategyRegistry registry;
      strata::register_builtin_strategies(registry);
      std::shared_ptr<strata::Strategy> s = registry.create(name, comm);
      try {
        strata::Trainer(options_for(2, 1, 0.0, 2), s).fit(module, data);
      } catch (const c10::Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what_without_backtrace());
      }
    }, std::chrono::seconds(30));
    ASSERT_EQ(errors.size(), 2u) << name << ": every rank must raise";
    for (const auto& e : errors) EXPECT_NE(e.find("unused"), std::string::npos) << e;
  }
  // find_unused_parameters tolerates it.
  strata::run_thread_world(2, [&](strata::Comm& comm) {
    WithUnused module;
    strata::testing::ToyData data;
    auto s = std::make_shared<strata::DDPStrategy>(comm, strata::DDPOptions().find_unused_parameters(true));
    EXPECT_NO_THROW(strata::Trainer(options_for(2, 1, 0.0, 2), s).fit(module, data));
  }, std::chrono::seconds(30));
}

TEST(StrategyErrorTest, ParameterFrozenAfterSetupIsAClearErrorNotAHang) {
  class FreezeAtStepTwo : public strata::Callback {
   public:
    std::string name() const override { return "FreezeAtStepTwo"; }
    void on_train_batch_start(strata::Trainer&, strata::TrainingModule& m, int64_t step) override {
      if (step == 2) m.module().named_parameters()["ln_f.weight"].set_requires_grad(false);
    }
  };
  for (const std::string name : {"ddp", "oss", "sdp"}) {
    std::mutex mu;
    std::vector<std::string> errors;
    strata::run_thread_world(2, [&](strata::Comm& comm) {
      auto module = make_module();
      strata::testing::ToyData data;
      strata::StrategyRegistry registry;
      strata::register_builtin_strategies(registry);
      try {
        strata::Trainer(options_for(2, 1, 0.0, 4), registry.create(name, comm),
                        {std::make_shared<FreezeAtStepTwo>()}).fit(module, data);
      } catch (const c10::Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what_without_backtrace());
      }
    }, std::chrono::seconds(30));
    ASSERT_EQ(errors.size(), 2u) << name << ": every rank must raise";
    for (const auto& e : errors) EXPECT_NE(e.find("ln_f.weight"), std::string::npos) << name << ": " << e;
  }
}

TEST(StrategyErrorTest, SingleStrategyRefusesSeveralRanks) {
  std::mutex mu;
  int errors = 0;
  strata::run_thread_world(2, [&](strata::Comm& comm) {
    try {
      strata::SingleDeviceStrategy s(comm);
    } catch (const c10::Error&) {
      std::lock_guard<std::mutex> lock(mu);
      ++errors;
    }
  });
  EXPECT_EQ(errors, 2);
}
}  // namespace

// ---------------------------------------------------------------------------
// Trustworthy strategies: a second fit with the same strategy, one rule for
// unused parameters (ddp/oss/sdp), mixed dtypes. Own namespace so helpers added
// above by others cannot collide.
namespace {
namespace trust {

using Params = std::vector<torch::Tensor>;
using MakeStrategy = std::function<std::shared_ptr<strata::Strategy>(strata::Comm&)>;

Params snapshot(torch::nn::Module& module) {
  Params out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

MakeStrategy from_registry(const std::string& name, std::map<std::string, std::string> options = {}) {
  return [name, options](strata::Comm& comm) -> std::shared_ptr<strata::Strategy> {
    strata::StrategyRegistry registry;
    strata::register_builtin_strategies(registry);
    return registry.create(name, comm, options);
  };
}

/// Runs `train(comm, strategy)` on `world` thread-ranks; every rank must end
/// with bit-identical results; returns rank 0's.
std::vector<Params> run_ranks(const std::string& what, int world, const MakeStrategy& make,
                              const std::function<std::vector<Params>(strata::Comm&, std::shared_ptr<strata::Strategy>)>& train) {
  std::mutex mu;
  std::vector<std::vector<Params>> per_rank(world);
  strata::run_thread_world(world, [&](strata::Comm& comm) {
    auto out = train(comm, make(comm));
    std::lock_guard<std::mutex> lock(mu);
    per_rank[comm.rank()] = std::move(out);
  }, std::chrono::seconds(30));
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(per_rank[r].size(), per_rank[0].size());
    for (size_t m = 0; m < per_rank[0].size() && m < per_rank[r].size(); ++m) {
      for (size_t i = 0; i < per_rank[0][m].size(); ++i) {
        EXPECT_TRUE(torch::equal(per_rank[0][m][i], per_rank[r][m][i]))
            << what << ": rank " << r << " differs from rank 0: model " << m << " param " << i;
      }
    }
  }
  return per_rank[0];
}

/// Every parameter within `tol` of the reference; float64 parameters within
/// 1e-12 (the tests keep their values independent of float32 ones).
/// Parameters within `tol` (float32 ones) or `tol64` (float64 ones; default:
/// `tol`) of the reference.
void expect_close(const std::vector<Params>& want, const std::vector<Params>& got, double tol,
                  const std::string& what, double tol64 = -1.0) {
  if (tol64 < 0) tol64 = tol;
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t m = 0; m < want.size(); ++m) {
    ASSERT_EQ(want[m].size(), got[m].size()) << what;
    for (size_t i = 0; i < want[m].size(); ++i) {
      const bool f64 = want[m][i].scalar_type() == torch::kFloat64;
      const double diff = (want[m][i] - got[m][i]).abs().max().item<double>();
      EXPECT_LE(diff, f64 ? tol64 : tol)
          << what << ": model " << m << " param " << i << " (" << want[m][i].scalar_type() << ")";
    }
  }
}

/// Three fits with one strategy object: the module twice (the second with
/// accumulation and clipping), then a fresh module.
std::vector<Params> three_fits(strata::Comm& comm, std::shared_ptr<strata::Strategy> strategy,
                               int64_t batch) {
  (void)comm;
  auto first = make_module();
  auto second = make_module();
  strata::testing::ToyData data;
  strata::Trainer(options_for(batch, 1, 0.0, 3), strategy).fit(first, data);
  strata::Trainer(options_for(batch, 2, 0.5, 2), strategy).fit(first, data);
  strata::Trainer(options_for(batch, 1, 0.0, 2), strategy).fit(second, data);
  return {snapshot(first.module()), snapshot(second.module())};
}

TEST(StrategyRepeatedFitTest, SecondFitWithTheSameStrategyMatchesSingleProcess) {
  for (int world : {2, 3}) {
    const auto reference = run_ranks("single", 1, [](strata::Comm& c) {
      return std::make_shared<strata::SingleDeviceStrategy>(c);
    }, [&](strata::Comm& c, auto s) { return three_fits(c, s, 2 * world); });
    for (const std::string name : {"ddp", "oss", "sdp"}) {
      const auto got = run_ranks(name, world, from_registry(name),
                                 [](strata::Comm& c, auto s) { return three_fits(c, s, 2); });
      // 3e-5: AdamW parity, see expect_parity (a first gradient that is
      // rounding noise; measured 1.7e-5 at world 2).
      expect_close(reference, got, 3e-5, name + " world " + std::to_string(world));
    }
  }
  // single: one strategy object for three fits == a fresh one per fit.
  const auto shared = run_ranks("single", 1, from_registry("single"),
                                [](strata::Comm& c, auto s) { return three_fits(c, s, 4); });
  const auto fresh = run_ranks("single", 1, from_registry("single"), [](strata::Comm& c, auto) {
    return three_fits(c, std::make_shared<strata::SingleDeviceStrategy>(c), 4);
  });
  expect_close(fresh, shared, 0.0, "single");
}

/// A small language model over ToyData with parameters that take no part in
/// some losses: `gate` only where `use_gate(sample)` says so (no sample: not
/// in the graph at all); `idle` (a Linear: a weight-decayed 2-D weight and a
/// bias) never, when present. Per sample, so splitting a batch over ranks
/// changes nothing.
class Gated : public strata::TrainingModule {
 public:
  Gated(std::function<torch::Tensor(const strata::Batch&)> use_gate, bool idle)
      : use_gate_(std::move(use_gate)), net_(std::make_shared<torch::nn::Module>()) {
    static std::mutex init_mutex;  // see make_module()
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(5);
    emb_ = net_->register_module("emb", torch::nn::Embedding(16, 8));
    gate_ = net_->register_parameter("gate", torch::randn({8}));
    head_ = net_->register_module("head", torch::nn::Linear(8, 16));
    if (idle) net_->register_module("idle", torch::nn::Linear(4, 4));
  }
  torch::nn::Module& module() override { return *net_; }
  torch::Tensor training_step(const strata::Batch& b) override {
    auto h = emb_(b.input);
    const auto mask = use_gate_(b);  // bool [B]
    if (mask.any().item<bool>()) h = h + gate_ * mask.to(h.scalar_type()).view({-1, 1, 1});
    return torch::nn::functional::cross_entropy(head_(h).view({-1, 16}), b.target.view(-1));
  }
  strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

 private:
  std::function<torch::Tensor(const strata::Batch&)> use_gate_;
  std::shared_ptr<torch::nn::Module> net_;
  torch::nn::Embedding emb_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor gate_;
};

/// Data-dependent: the gate acts on samples starting with a token divisible by 4.
torch::Tensor gate_by_data(const strata::Batch& b) { return b.input.select(1, 0) % 4 == 0; }

TEST(StrategyUnusedParameterTest, ErrorNamesTheParameterIdenticallyOnEveryRank) {
  for (const std::string name : {"ddp", "oss", "sdp", "fsdp"}) {
    for (bool idle : {false, true}) {
      std::mutex mu;
      std::vector<std::string> errors;
      strata::run_thread_world(2, [&](strata::Comm& comm) {
        // Without `idle`, only rank 1 leaves `gate` out: the ranks disagree,
        // and still every rank must raise (nobody may hang in the next step).
        const bool use = comm.rank() == 0;
        Gated module([use](const strata::Batch& b) { return torch::full({b.input.size(0)}, use); }, idle);
        strata::testing::ToyData data;
        try {
          strata::Trainer(options_for(2, 1, 0.0, 3), from_registry(name)(comm)).fit(module, data);
        } catch (const c10::Error& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back(e.what_without_backtrace());
        }
      }, std::chrono::seconds(5));
      const std::string what = name + (idle ? " (idle params)" : " (gate unused on rank 1)");
      ASSERT_EQ(errors.size(), 2u) << what << ": every rank must raise";
      EXPECT_EQ(errors[0], errors[1]) << what << ": ranks must raise the same error";
      for (const auto& e : errors) {
        EXPECT_NE(e.find(name + ": "), std::string::npos) << what << ": " << e;
        EXPECT_NE(e.find("gate on 1 of 2 rank(s)"), std::string::npos) << what << ": " << e;
        if (idle) {
          EXPECT_NE(e.find("idle.weight on 2 of 2 rank(s), idle.bias on 2 of 2 rank(s)"), std::string::npos)
              << what << ": " << e;
        }
        EXPECT_NE(e.find("find_unused_parameters"), std::string::npos) << what << ": " << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << what << ": one line: " << e;
      }
    }
  }
}

TEST(StrategyUnusedParameterTest, WithTheFlagMatchesSingleProcess) {
  const int64_t steps = 6;
  // The data must make the case interesting: steps where the ranks disagree on
  // `gate` and steps where no rank uses it.
  for (int world : {2, 3}) {
    strata::testing::ToyData data;
    int mixed = 0, nobody = 0;
    for (int64_t s = 0; s < steps; ++s) {
      int users = 0;
      for (int r = 0; r < world; ++r) {
        users += gate_by_data(data.train_batch(s, 2, {r, world})).any().item<bool>();
      }
      mixed += users > 0 && users < world;
      nobody += users == 0;
    }
    ASSERT_GT(mixed, 0) << "world " << world;
    ASSERT_GT(nobody, 0) << "world " << world;
  }
  auto train = [&](int64_t batch) {
    return [batch, steps](strata::Comm&, std::shared_ptr<strata::Strategy> s) {
      Gated module(gate_by_data, /*idle=*/true);
      strata::testing::ToyData data;
      strata::Trainer(options_for(batch, 1, 0.0, steps), s).fit(module, data);
      const auto full = s->full_params();  // fsdp: gathers the shards (others: nothing to do)
      return std::vector<Params>{snapshot(module.module())};
    };
  };
  const std::map<std::string, std::string> flag = {{"find-unused-parameters", "true"}};
  for (int world : {2, 3}) {
    const auto reference = run_ranks("single", 1, from_registry("single"), train(2 * world));
    for (const std::string name : {"ddp", "oss", "sdp", "fsdp"}) {
      expect_close(reference, run_ranks(name, world, from_registry(name, flag), train(2)), 1e-5,
                   name + " world " + std::to_string(world));
    }
  }
}

TEST(StrategyUnusedParameterTest, UsedInAnEarlierMicroBatchIsNotUnused) {
  // Accumulating over two micro-batches, `gate` takes part in the first only
  // (under no_sync): it has a gradient, so no error, and it is reduced.
  auto train = [](int64_t batch) {
    return [batch](strata::Comm&, std::shared_ptr<strata::Strategy> s) {
      auto calls = std::make_shared<int64_t>(0);
      Gated module([calls](const strata::Batch& b) {
        return torch::full({b.input.size(0)}, (*calls)++ % 2 == 0);
      }, /*idle=*/false);
      strata::testing::ToyData data;
      strata::Trainer(options_for(batch, 2, 0.0, 3), s).fit(module, data);
      return std::vector<Params>{snapshot(module.module())};
    };
  };
  const auto reference = run_ranks("single", 1, from_registry("single"), train(4));
  for (const std::string name : {"ddp", "oss", "sdp"}) {
    expect_close(reference, run_ranks(name, 2, from_registry(name), train(2)), 1e-5, name);
  }
}

/// fp32 language model plus a float64 parameter (its loss term depends on the
/// data only, so its parity can be checked at float64 precision).
class MixedDtype : public strata::TrainingModule {
 public:
  MixedDtype() : net_(std::make_shared<torch::nn::Module>()) {
    static std::mutex init_mutex;  // see make_module()
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(3);
    emb_ = net_->register_module("emb", torch::nn::Embedding(16, 8));
    // Registered between the float32 layers, so buckets interleave dtypes.
    auto aux = net_->register_module("aux", std::make_shared<torch::nn::Module>());
    offset_ = aux->register_parameter("offset", torch::randn({8}, torch::kFloat64));
    head_ = net_->register_module("head", torch::nn::Linear(8, 16));
  }
  torch::nn::Module& module() override { return *net_; }
  torch::Tensor training_step(const strata::Batch& b) override {
    auto ce = torch::nn::functional::cross_entropy(head_(emb_(b.input)).view({-1, 16}), b.target.view(-1));
    auto fit = (b.input.to(torch::kFloat64) / 16.0 - offset_).pow(2).mean();
    return ce.to(torch::kFloat64) + fit;
  }
  strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

 private:
  std::shared_ptr<torch::nn::Module> net_;
  torch::nn::Embedding emb_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor offset_;
};

// Tolerances follow from the arithmetic, not from one CPU. Without clipping
// nothing of float32 reaches `offset` (float64): single and ddp differ only in
// float64 rounding — each gradient element sums batch·T·8 terms (relative
// error ≤ terms·eps64, passed at most twice into AdamW's m/√v, so ≤ 2·lr·that
// per step), and each step rounds the parameter itself (≤ 2·|p|·eps64 with
// decay). A float64 gradient that went through a float32 bucket is off by
// ~eps32 = 1.2e-7 relative, i.e. ~lr·1e-7 per step: 4 orders of magnitude
// above the bound. With clipping, the global norm (dominated by the float32
// gradients) scales `offset`'s gradient: the clip coefficient's float32
// rounding (a few eps32) then reaches the update, ≤ lr·8·eps32 per step.
TEST(StrategyMixedDtypeTest, DdpBucketsNeverMixDtypesAndMatchSingleProcess) {
  constexpr int64_t kSteps = 4, kBatch = 4, kBlock = 8;  // ToyData's block
  constexpr double kLr = 1e-3, kEps32 = 1.1920929e-7, kEps64 = 2.220446049250313e-16;
  constexpr double kMaxAbsParam = 8.0;  // randn(8): |offset| stays far below
  auto train = [](int64_t batch, double clip) {
    return [batch, clip](strata::Comm&, std::shared_ptr<strata::Strategy> s) {
      MixedDtype module;
      strata::testing::ToyData data;
      strata::Trainer(options_for(batch, 1, clip, kSteps), s).fit(module, data);
      return std::vector<Params>{snapshot(module.module())};
    };
  };
  const double float64_rounding =
      kSteps * (2 * kLr * (kBatch * kBlock * 8) * kEps64 + 2 * kMaxAbsParam * kEps64);
  const double clip_rounding = kSteps * kLr * 8 * kEps32;
  for (const double clip : {0.0, 0.5}) {
    const double tol64 = clip > 0 ? clip_rounding : float64_rounding;
    const auto reference = run_ranks("single", 1, from_registry("single"), train(kBatch, clip));
    // 25 MiB: one bucket per dtype; 0.0006 MiB: buckets float32 (head), float64
    // (aux.offset), float32 (emb); 0: one parameter per bucket.
    for (double cap : {25.0, 0.0006, 0.0}) {
      const auto got = run_ranks("ddp", 2, [cap](strata::Comm& c) {
        return std::make_shared<strata::DDPStrategy>(c, strata::DDPOptions().bucket_cap_mb(cap));
      }, train(kBatch / 2, clip));
      expect_close(reference, got, 1e-5, "ddp cap " + std::to_string(cap) + " MiB, clip " + std::to_string(clip),
                   tol64);
    }
  }
}

TEST(StrategyMixedDtypeTest, ShardedStrategiesRefuseMixedDtypesNamingThem) {
  for (const std::string name : {"oss", "sdp"}) {
    std::mutex mu;
    std::vector<std::string> errors;
    strata::run_thread_world(2, [&](strata::Comm& comm) {
      MixedDtype module;
      strata::testing::ToyData data;
      try {
        strata::Trainer(options_for(2, 1, 0.0, 2), from_registry(name)(comm)).fit(module, data);
      } catch (const c10::Error& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what_without_backtrace());
      }
    }, std::chrono::seconds(5));
    ASSERT_EQ(errors.size(), 2u) << name << ": every rank must raise";
    for (const auto& e : errors) {
      for (const char* part : {"offset", "Double", "emb.weight", "Float"}) {
        EXPECT_NE(e.find(part), std::string::npos) << name << ": '" << part << "' missing in: " << e;
      }
      EXPECT_EQ(e.find('\n'), std::string::npos) << name << ": one line: " << e;
    }
  }
}

}  // namespace trust
}  // namespace
