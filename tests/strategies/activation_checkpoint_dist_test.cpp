// activation_checkpoint_dist_test - activation checkpointing under every
// strategy, ranks as threads: training with checkpointing must give the
// parameters training without it gives. DDP and SDP communicate from
// post-hooks on each parameter's AccumulateGrad node, and a checkpointed
// unit's parameters get their gradients in the backward through the
// recomputed graph, so this checks that those hooks still fire.
#include "strata/strategies/activation_checkpoint.h"

#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/thread_world.h"
#include "tests/mlp_stack.h"
#include "tests/toy_data.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {
using strata::ActivationCheckpointOptions;
using strata::TrainingModule;

using ModuleFactory = std::function<std::unique_ptr<TrainingModule>()>;

/// Trains on 2 thread-ranks and returns rank 0's parameters; every rank must
/// end with the same ones. The modules are built here, on one thread, before
/// the ranks start: thread-ranks share torch's default generator.
std::vector<torch::Tensor> train(const std::string& strategy, const ModuleFactory& make,
                                 const std::optional<ActivationCheckpointOptions>& checkpointing) {
  const int world = 2;
  std::vector<std::unique_ptr<TrainingModule>> modules;
  for (int r = 0; r < world; ++r) {
    modules.push_back(make());
    if (checkpointing) strata::apply_activation_checkpointing(*modules.back(), *checkpointing);
  }
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  std::mutex mu;
  std::vector<std::vector<torch::Tensor>> per_rank(world);
  strata::run_thread_world(world, [&](strata::Comm& comm) {
    auto& module = *modules[comm.rank()];
    strata::testing::ToyData data;
    strata::Trainer(strata::TrainerOptions().max_steps(4).batch_size(2).lr(1e-2).min_lr(1e-3)
                        .warmup_steps(1).limit_val_batches(0),
                    registry.create(strategy, comm))
        .fit(module, data);
    std::vector<torch::Tensor> params;
    for (const auto& p : module.module().parameters()) params.push_back(p.detach().clone());
    std::lock_guard<std::mutex> lock(mu);
    per_rank[comm.rank()] = std::move(params);
  }, std::chrono::seconds(30));
  for (size_t i = 0; i < per_rank[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(per_rank[0][i], per_rank[1][i])) << strategy << " param " << i;
  }
  return per_rank[0];
}

void expect_same_training(const std::string& model, const ModuleFactory& make) {
  for (const std::string strategy : {"ddp", "oss", "sdp"}) {
    const auto plain = train(strategy, make, std::nullopt);
    // The op policy: kept outputs replayed while the strategies' gradient
    // hooks (buckets, owners) fire from the replayed ops' backward.
    for (const auto& ac : {ActivationCheckpointOptions().every_n(1), ActivationCheckpointOptions().every_n(2),
                           ActivationCheckpointOptions().policy("op")}) {
      const std::string what =
          model + " " + strategy + " every_n=" + std::to_string(ac.every_n()) + " policy=" + ac.policy();
      const auto checkpointed = train(strategy, make, ac);
      ASSERT_EQ(plain.size(), checkpointed.size()) << what;
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_LE((plain[i] - checkpointed[i]).abs().max().item<double>(), 1e-6) << what << " param " << i;
      }
    }
  }
}

TEST(ActivationCheckpointDistTest, GptNanoTrainsTheSameUnderEveryStrategy) {
  expect_same_training("gpt-nano", [] {
    torch::manual_seed(11);
    return std::make_unique<strata::recipes::GPTModule>(
        strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false));
  });
}

TEST(ActivationCheckpointDistTest, UsersOwnModelTrainsTheSameUnderEveryStrategy) {
  expect_same_training("mlp-stack", [] {
    torch::manual_seed(12);
    return std::make_unique<strata::testing::MlpStackModule>(16, 24, 3);
  });
}

}  // namespace
