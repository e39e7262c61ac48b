// strategy_threads_test - DDP / OSS / SDP against single-process training,
// ranks as threads in one process (a HashStore and one Gloo group per thread).
// Fast enough to sweep world sizes 1-4 (uneven too) and options; the
// multi-process parity through the real launcher is in parity_test.cpp.
#include "recipes/gpt.h"
#include "strategies/ddp.h"
#include "strategies/oss.h"
#include "strategies/registry.h"
#include "strategies/sdp.h"
#include "strategies/single_device.h"
#include "strategies/thread_world.h"
#include "tests/toy_data.h"
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <functional>
#include <mutex>

namespace {
using strata::recipes::GPTModule;

struct Case {
  std::string strategy;
  int world;
  int64_t accum;
  double clip;
};

std::string label(const Case& c) {
  return "strategy=" + c.strategy + " world=" + std::to_string(c.world) + " accum=" +
         std::to_string(c.accum) + " clip=" + std::to_string(c.clip);
}

GPTModule make_module() {
  // Thread-ranks share torch's global generator: seed and draw under a lock so
  // every rank (and the reference) gets the same initial weights.
  static std::mutex init_mutex;
  std::lock_guard<std::mutex> lock(init_mutex);
  torch::manual_seed(11);
  // No Linear biases: the attention key bias has an analytically zero
  // gradient (softmax ignores a per-query constant), so its gradient is pure
  // rounding noise that Adam normalises into lr-sized, order-dependent steps.
  return GPTModule(strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false));
}

strata::TrainerOptions options_for(int64_t batch, int64_t accum, double clip, int64_t steps) {
  return strata::TrainerOptions().max_steps(steps).batch_size(batch).accumulate_grad_batches(accum)
      .gradient_clip_val(clip).lr(1e-3).min_lr(1e-4).warmup_steps(2).limit_val_batches(0);
}

/// Records the global gradient norm the Trainer reports for every step.
class GradNorms : public strata::Callback {
 public:
  std::string name() const override { return "GradNorms"; }
  void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics& m) override {
    norms.push_back(m.grad_norm);
  }
  std::vector<double> norms;
};

/// Final parameters and every step's (pre-clipping) global gradient norm.
struct Trained {
  std::vector<torch::Tensor> params;
  std::vector<double> grad_norms;
};

Trained trained(GPTModule& module, const GradNorms& norms) {
  Trained out;
  for (const auto& p : module.module().parameters()) out.params.push_back(p.detach().clone());
  out.grad_norms = norms.norms;
  return out;
}

/// One process; `options.batch_size()` is the global batch.
Trained train_single(const strata::TrainerOptions& options) {
  auto module = make_module();
  strata::testing::ToyData data;
  auto norms = std::make_shared<GradNorms>();
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(), {norms}).fit(module, data);
  return trained(module, *norms);
}

std::vector<torch::Tensor> train_single(int64_t global_batch, int64_t accum, double clip, int64_t steps) {
  return train_single(options_for(global_batch, accum, clip, steps)).params;
}

/// Trains on `world` thread-ranks (`options.batch_size()` per rank); returns
/// rank 0's result and checks that every rank ends with identical parameters
/// and saw the same gradient norms.
Trained train_threads(const std::string& strategy_name, int world, const strata::TrainerOptions& options,
                      const std::string& what) {
  std::mutex mu;
  std::vector<Trained> per_rank(world);
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  strata::run_thread_world(world, [&](strata::Comm& comm) {
    auto module = make_module();
    strata::testing::ToyData data;
    auto norms = std::make_shared<GradNorms>();
    std::shared_ptr<strata::Strategy> strategy = registry.create(strategy_name, comm);
    strata::Trainer(options, strategy, {norms}).fit(module, data);
    std::lock_guard<std::mutex> lock(mu);
    per_rank[comm.rank()] = trained(module, *norms);
  }, std::chrono::seconds(30));
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < per_rank[0].params.size(); ++i) {
      EXPECT_TRUE(torch::equal(per_rank[0].params[i], per_rank[r].params[i])) << what << " rank " << r << " param " << i;
    }
    EXPECT_EQ(per_rank[0].grad_norms, per_rank[r].grad_norms) << what << " rank " << r;
  }
  return per_rank[0];
}

std::vector<torch::Tensor> train_threads(const Case& c, int64_t per_rank_batch, int64_t steps) {
  return train_threads(c.strategy, c.world, options_for(per_rank_batch, c.accum, c.clip, steps), label(c)).params;
}

void expect_parity(const Case& c) {
  const int64_t per_rank_batch = 2;
  const int64_t steps = 10;
  auto reference = train_single(per_rank_batch * c.world, c.accum, c.clip, steps);
  auto got = train_threads(c, per_rank_batch, steps);
  ASSERT_EQ(reference.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = (reference[i] - got[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5) << label(c) << " param " << i;
  }
}

TEST(StrategyParityTest, DdpMatchesSingleProcessAfterTenSteps) {
  for (int world : {1, 2, 3}) expect_parity({"ddp", world, 1, 0.0});
  expect_parity({"ddp", 2, 2, 0.5});
}

TEST(StrategyParityTest, OssMatchesSingleProcessAfterTenSteps) {
  for (int world : {1, 2, 3, 4}) expect_parity({"oss", world, 1, 0.0});
  expect_parity({"oss", 3, 2, 0.5});
}

TEST(StrategyParityTest, SdpMatchesSingleProcessAfterTenSteps) {
  for (int world : {1, 2, 3, 4}) expect_parity({"sdp", world, 1, 0.0});
  expect_parity({"sdp", 3, 2, 0.5});
}

// ---- Gradient scale ----
// AdamW divides each update by the element's own RMS, so the parity tests
// above cannot see a gradient that is N times too large or too small (a
// missing or doubled division by the world size): they would pass. Plain SGD
// updates by lr * gradient, so a scale error moves every parameter by about
// (N-1) * lr * |g| per step, and the reported global gradient norm is off by
// N from step 1. No clipping here: it would rescale a too-large gradient.
// lr 0.1: measured worst differences to one process 1.2e-7 (params) and
// 1.7e-6 relative (grad norms); at lr 0.5, world size 3 turned chaotic and
// amplified fp32 rounding to 3.3e-5 (params) and 1.7e-4 relative (norms).
constexpr double kSgdLr = 0.1;

strata::TrainerOptions sgd_options(int64_t batch, int64_t accum) {
  return strata::TrainerOptions().optimizer("sgd").max_steps(10).batch_size(batch).accumulate_grad_batches(accum)
      .gradient_clip_val(0.0).lr(kSgdLr).min_lr(kSgdLr / 10).warmup_steps(2).limit_val_batches(0);
}

/// `strategy` at world sizes 1-4, with and without accumulation, against one
/// process with the same global batch: per-step gradient norms within 1e-5
/// relative, final SGD parameters within 1e-5.
void expect_gradient_scale_parity(const std::string& strategy) {
  const int64_t per_rank_batch = 2;
  for (int world : {1, 2, 3, 4}) {
    for (int64_t accum : {1, 2}) {
      const std::string what = strategy + " world=" + std::to_string(world) + " accum=" + std::to_string(accum);
      const Trained reference = train_single(sgd_options(per_rank_batch * world, accum));
      const Trained got = train_threads(strategy, world, sgd_options(per_rank_batch, accum), what);
      ASSERT_EQ(got.grad_norms.size(), 10u) << what;
      ASSERT_EQ(reference.grad_norms.size(), got.grad_norms.size()) << what;
      for (size_t step = 0; step < got.grad_norms.size(); ++step) {
        EXPECT_NEAR(got.grad_norms[step], reference.grad_norms[step], 1e-5 * reference.grad_norms[step])
            << what << " step " << step + 1 << " (ratio " << got.grad_norms[step] / reference.grad_norms[step] << ")";
      }
      ASSERT_EQ(reference.params.size(), got.params.size()) << what;
      for (size_t i = 0; i < got.params.size(); ++i) {
        const double diff = (reference.params[i] - got.params[i]).abs().max().item<double>();
        EXPECT_LE(diff, 1e-5) << what << " param " << i;
      }
    }
  }
}

TEST(GradientScaleTest, DdpSgdAndGradNormsMatchSingleProcess) { expect_gradient_scale_parity("ddp"); }
TEST(GradientScaleTest, OssSgdAndGradNormsMatchSingleProcess) { expect_gradient_scale_parity("oss"); }
TEST(GradientScaleTest, SdpSgdAndGradNormsMatchSingleProcess) { expect_gradient_scale_parity("sdp"); }

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
