// grad_buckets_test - bucket assignment and launch order (strategies/grad_buckets.cpp),
// and DDP's per-gradient mode (bucket_cap_mb 0).
#include "strata/strategies/ddp/ddp.h"
#include "strata/strategies/grad_buckets.h"
#include "tests/error_text.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

namespace {
using Buckets = std::vector<std::vector<size_t>>;

std::vector<torch::Tensor> floats(std::initializer_list<int64_t> sizes) {
  std::vector<torch::Tensor> out;
  for (int64_t n : sizes) out.push_back(torch::zeros({n}));
  return out;
}

TEST(AssignBucketsTest, ReverseRegistrationOrderWithinTheCap) {
  const auto params = floats({10, 20, 30, 40});  // 40, 80, 120, 160 bytes
  // Reverse order: 160 alone (adding 120 would pass 200), then 120 + 80 = 200, then 40.
  EXPECT_EQ(strata::assign_buckets(params, 200), (Buckets{{3}, {2, 1}, {0}}));
  EXPECT_EQ(strata::assign_buckets(params, 1), (Buckets{{3}, {2}, {1}, {0}}));  // each alone
  EXPECT_EQ(strata::assign_buckets(params, 1 << 20), (Buckets{{3, 2, 1, 0}}));
  const auto msg = strata::testing::what_of([&] { strata::assign_buckets(params, 0); });
  EXPECT_NE(msg.find("got 0"), std::string::npos) << msg;
}

TEST(AssignBucketsTest, NeverMixesDtypesAndKeepsReverseOrder) {
  // fp32 (4 bytes) and fp64 (8 bytes) parameters interleaved, as torch DDP
  // does: one open bucket per dtype, and buckets ordered by the position of
  // their first (latest-registered) parameter, so ranks agree on the order.
  std::vector<torch::Tensor> params = {torch::zeros({10}), torch::zeros({10}, torch::kFloat64),
                                       torch::zeros({10}), torch::zeros({10}, torch::kFloat64),
                                       torch::zeros({10})};
  EXPECT_EQ(strata::assign_buckets(params, 1 << 20), (Buckets{{4, 2, 0}, {3, 1}}));
  // 80-byte cap: fp32 buckets hold two params, fp64 buckets one.
  EXPECT_EQ(strata::assign_buckets(params, 80), (Buckets{{4, 2}, {3}, {1}, {0}}));
  for (const auto& bucket : strata::assign_buckets(params, 80)) {
    for (size_t p : bucket) EXPECT_EQ(params[p].scalar_type(), params[bucket.front()].scalar_type());
  }
}

struct Chain {
  torch::nn::Sequential net{torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 8),
                            torch::nn::Tanh(), torch::nn::Linear(8, 1)};
  std::vector<torch::Tensor> params = net->parameters();
  torch::Tensor loss() { return net->forward(torch::randn({5, 4})).pow(2).sum(); }
};

TEST(GradReadinessTest, BucketsLaunchInOrderWhileBackwardIsStillRunning) {
  Chain chain;
  auto buckets = strata::assign_buckets(chain.params, 1);  // one parameter per bucket
  const size_t n = buckets.size();
  std::vector<std::pair<size_t, size_t>> launches;  // (bucket, parameters still without a gradient)
  strata::GradReadiness* readiness_ptr = nullptr;
  strata::GradReadiness readiness(chain.params, buckets, [&](size_t b) {
    launches.emplace_back(b, readiness_ptr->unready_params().size());
  });
  readiness_ptr = &readiness;
  bool active = true;
  readiness.install_hooks([&] { return active; });

  chain.loss().backward();
  ASSERT_EQ(launches.size(), n);
  for (size_t k = 0; k < n; ++k) EXPECT_EQ(launches[k].first, k);
  // The first bucket (the last layer's bias) went out while earlier layers'
  // gradients were still being computed: that is the overlap.
  EXPECT_GT(launches.front().second, 0u);
  EXPECT_EQ(launches.back().second, 0u);
  EXPECT_TRUE(readiness.all_launched());

  // Under no_sync (hooks inactive) nothing launches; launch_remaining sends
  // every bucket, in order.
  launches.clear();
  readiness.reset();
  active = false;
  chain.loss().backward();
  EXPECT_TRUE(launches.empty());
  EXPECT_EQ(readiness.unready_params().size(), chain.params.size());
  readiness.launch_remaining();
  ASSERT_EQ(launches.size(), n);
  for (size_t k = 0; k < n; ++k) EXPECT_EQ(launches[k].first, k);
}

TEST(GradReadinessTest, AnUnreadyBucketHoldsBackTheLaterOnes) {
  Chain chain;
  // 36-byte cap: bucket 0 = the last Linear (bias, weight: 4 + 32 bytes),
  // then one bucket per remaining parameter, the first Linear's last (3 and 4).
  auto buckets = strata::assign_buckets(chain.params, (8 + 1) * 4);
  ASSERT_EQ(buckets, (Buckets{{5, 4}, {3}, {2}, {1}, {0}}));
  std::vector<size_t> launched;
  strata::GradReadiness readiness(chain.params, buckets, [&](size_t b) { launched.push_back(b); });
  readiness.install_hooks([] { return true; });
  // Only the first Linear gets a gradient: its buckets (3, 4) are complete,
  // but buckets 0-2 never are, and launching strictly in order holds them back.
  auto first = chain.net[0]->as<torch::nn::Linear>();
  first->forward(torch::randn({2, 4})).sum().backward();
  EXPECT_TRUE(launched.empty());
  EXPECT_FALSE(readiness.all_launched());
  EXPECT_EQ(readiness.unready_params(), (std::vector<size_t>{2, 3, 4, 5}));
  readiness.launch_remaining();
  EXPECT_EQ(launched, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

/// Chain as a TrainingModule, for strategies' setup().
class ChainModule : public strata::TrainingModule {
 public:
  torch::nn::Module& module() override { return *chain_.net; }
  torch::Tensor training_step(const strata::Batch&) override { return chain_.loss(); }
  strata::ValidationStep validation_step(const strata::Batch&) override { return {}; }

 private:
  Chain chain_;
};

TEST(DDPStrategyTest, BucketCapZeroIsOneAllReducePerGradient) {
  ChainModule net;
  strata::DDPStrategy ddp(strata::Comm(), strata::DDPOptions().bucket_cap_mb(0));
  ddp.setup(net);
  const auto text = ddp.describe();
  EXPECT_NE(text.find("no bucketing (6 gradients, one all-reduce each)"), std::string::npos) << text;
  EXPECT_THROW(strata::DDPStrategy(strata::Comm(), strata::DDPOptions().bucket_cap_mb(-1)), c10::Error);
}

TEST(GradReadinessTest, ConcurrentMarkReadyLaunchesEveryBucketOnceInOrder) {
  // Autograd may run AccumulateGrad post-hooks on several threads (one per
  // device). Hammer mark_ready from 8 threads released together, many rounds:
  // every bucket must launch exactly once per round, in bucket order, and
  // never two launches at a time.
  constexpr size_t kParams = 4096;
  constexpr int kThreads = 8;
  constexpr int kRounds = 40;
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < kParams; ++i) params.push_back(torch::zeros({int64_t(1 + i % 3)}));
  // 1-4 parameters per bucket; neighbours (marked by different threads) share one.
  const auto buckets = strata::assign_buckets(params, 16);
  ASSERT_GT(buckets.size(), kParams / 4);
  std::vector<size_t> launched;  // written only inside launch
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  strata::GradReadiness readiness(params, buckets, [&](size_t b) {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    launched.push_back(b);
    if (b % 64 == 0) std::this_thread::yield();  // widen the window for a racing launcher
    inside.fetch_sub(1);
  });
  for (int round = 0; round < kRounds; ++round) {
    readiness.reset();
    launched.clear();
    std::atomic<int> waiting{kThreads};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        waiting.fetch_sub(1);
        while (waiting.load() > 0) std::this_thread::yield();  // start together
        // Thread t marks params t, t+8, ... in reverse (backward's) order.
        for (size_t i = static_cast<size_t>(t); i < kParams; i += kThreads) readiness.mark_ready(kParams - 1 - i);
      });
    }
    for (auto& th : threads) th.join();
    ASSERT_EQ(launched.size(), buckets.size()) << "round " << round;
    for (size_t k = 0; k < launched.size(); ++k) ASSERT_EQ(launched[k], k) << "round " << round;
    ASSERT_TRUE(readiness.all_launched()) << "round " << round;
    ASSERT_TRUE(readiness.unready_params().empty()) << "round " << round;
  }
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(DDPStrategyTest, SecondSetupRebuildsTheBucketsInsteadOfAppending) {
  ChainModule first, second;
  strata::DDPStrategy ddp(strata::Comm(), strata::DDPOptions().bucket_cap_mb(0));
  ddp.setup(first);
  ddp.setup(first);
  ddp.setup(second);
  const auto text = ddp.describe();
  EXPECT_NE(text.find("(6 gradients, one all-reduce each)"), std::string::npos) << text;
  // A step on the module set up last: its gradients land in the live buckets.
  ddp.backward(second.training_step({}));
  ddp.reduce_gradients();
  for (const auto& p : second.module().parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
  }
}

}  // namespace
