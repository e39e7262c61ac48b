// deferred_init_test - core/deferred_init.h and GPT built deferred: a deferred
// build plus init_parameter gives the eager model bit for bit, whatever the
// order and place of initialisation; the base Strategy materialises a
// deferred module; meta-device parameters keep their identity.
#include "strata/core/deferred_init.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/single/single_device.h"
#include "tests/mlp_stack.h"
#include "tests/toy_data.h"
#include "strata/trainer/memory.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace {
using strata::recipes::GPTModule;
using strata::recipes::GPTOptions;

GPTOptions small_gpt() {
  // Untied, with biases and dropout: every kind of parameter, and a build
  // whose submodule constructors draw from the default generator.
  return strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).tie_weights(false).dropout(0.1);
}

std::vector<torch::Tensor> clone_params(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
  }
}

TEST(DeferredInitTest, ParameterMovesToMetaAndBackKeepingItsIdentity) {
  torch::nn::Linear linear(4, 3);
  const auto* impl = linear->weight.unsafeGetTensorImpl();
  strata::defer_parameters(*linear);
  EXPECT_TRUE(strata::has_deferred_parameters(*linear));
  EXPECT_TRUE(linear->weight.is_meta());
  EXPECT_EQ(linear->weight.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(linear->weight.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(linear->weight.requires_grad());
  EXPECT_EQ(linear->weight.unsafeGetTensorImpl(), impl);
  // Module::to cannot leave meta (set_data refuses); move_materialized skips it.
  EXPECT_THROW(linear->to(torch::kCPU), c10::Error);
  strata::move_materialized(*linear, torch::kCPU);
  EXPECT_TRUE(linear->weight.is_meta());

  // Materialised as a view of a larger buffer: still the module's leaf.
  auto buffer = torch::zeros({20});
  strata::replace_data(linear->weight, buffer.narrow(0, 2, 12).view({3, 4}));
  strata::replace_data(linear->bias, buffer.narrow(0, 14, 3));
  EXPECT_FALSE(strata::has_deferred_parameters(*linear));
  EXPECT_EQ(linear->weight.unsafeGetTensorImpl(), impl);
  {
    torch::NoGradGuard no_grad;
    linear->weight.fill_(1.0);
  }
  EXPECT_EQ(buffer[2].item<float>(), 1.0f);  // a view of the buffer
  auto out = linear(torch::ones({2, 4})).sum();
  out.backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  EXPECT_EQ(linear->weight.grad().sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(torch::equal(linear->weight.grad(), torch::full({3, 4}, 2.0f)));
  EXPECT_THROW(strata::replace_data(linear->weight, torch::empty({3, 4}, torch::kFloat64)), c10::Error);
}

TEST(DeferredInitTest, ParameterSeedsDependOnSeedAndNameOnly) {
  EXPECT_EQ(strata::parameter_seed(7, "h0.attn.c_attn.weight"), strata::parameter_seed(7, "h0.attn.c_attn.weight"));
  EXPECT_NE(strata::parameter_seed(7, "h0.attn.c_attn.weight"), strata::parameter_seed(8, "h0.attn.c_attn.weight"));
  EXPECT_NE(strata::parameter_seed(7, "h0.attn.c_attn.weight"), strata::parameter_seed(7, "h1.attn.c_attn.weight"));
  // normal_init: the same values in a standalone tensor, a view of a buffer
  // and a non-contiguous tensor.
  auto standalone = torch::empty({5, 7});
  strata::normal_init(standalone, 0.0, 0.02, strata::parameter_generator(7, "w"));
  auto buffer = torch::zeros({50});
  auto view = buffer.narrow(0, 3, 35).view({5, 7});
  strata::normal_init(view, 0.0, 0.02, strata::parameter_generator(7, "w"));
  EXPECT_TRUE(torch::equal(standalone, view));
  auto transposed = torch::empty({7, 5}).t();
  strata::normal_init(transposed, 0.0, 0.02, strata::parameter_generator(7, "w"));
  EXPECT_TRUE(torch::equal(standalone, transposed));
}

TEST(DeferredInitTest, DeferredGptPlusInitEqualsEagerBitForBit) {
  torch::manual_seed(5);
  GPTModule eager(small_gpt());
  const auto after_eager = torch::rand({16});  // the default generator after the build
  const auto expected = clone_params(eager.module());

  torch::manual_seed(5);
  GPTModule deferred(small_gpt(), /*deferred=*/true);
  const auto after_deferred = torch::rand({16});
  // Same draws from the default generator: dropout streams stay identical.
  EXPECT_TRUE(torch::equal(after_eager, after_deferred));
  EXPECT_TRUE(deferred.has_deferred_parameters());
  for (const auto& p : deferred.module().parameters()) EXPECT_TRUE(p.is_meta());
  // Sizes count the logical model.
  EXPECT_EQ(deferred.model()->num_params(), eager.model()->num_params());
  EXPECT_EQ(deferred.model()->num_params(true), eager.model()->num_params(true));
  EXPECT_EQ(deferred.flops_per_token(), eager.flops_per_token());
  const auto eager_named = eager.module().named_parameters();
  const auto deferred_named = deferred.module().named_parameters();
  ASSERT_EQ(eager_named.size(), deferred_named.size());
  for (size_t i = 0; i < eager_named.size(); ++i) {
    EXPECT_EQ(eager_named[i].key(), deferred_named[i].key());
    EXPECT_EQ(eager_named[i].value().sizes(), deferred_named[i].value().sizes());
  }

  strata::materialize_parameters(deferred, torch::kCPU);
  EXPECT_FALSE(deferred.has_deferred_parameters());
  expect_identical(expected, clone_params(deferred.module()));
  // And the eager values are not trivially equal (the init really ran).
  EXPECT_GT(expected.front().abs().sum().item<double>(), 0.0);
}

TEST(DeferredInitTest, DeferredBuildPeaksAtOneSubmoduleAndKeepsNothing) {
  // Eight 64-wide blocks (~200 KB each), small embeddings: the whole model is
  // eight times the largest submodule.
  const auto options = strata::recipes::GPTOptions(8, 4, 64).vocab_size(64).block_size(16);
  int64_t model_bytes = 0, largest_submodule = 0;
  {
    torch::manual_seed(1);
    GPTModule eager(options);
    for (const auto& p : eager.module().parameters()) model_bytes += p.nbytes();
    for (const auto& child : eager.module().children()) {
      int64_t bytes = 0;
      for (const auto& p : child->parameters()) bytes += p.nbytes();
      largest_submodule = std::max(largest_submodule, bytes);
    }
  }
  strata::MemoryTracker tracker;
  const int64_t base = tracker.current_bytes();
  tracker.reset_peak();
  torch::manual_seed(1);
  GPTModule deferred(options, /*deferred=*/true);
  EXPECT_EQ(tracker.current_bytes() - base, 0);  // every parameter on the meta device
  EXPECT_LE(tracker.peak_bytes() - base, largest_submodule);
  EXPECT_GT(model_bytes, 4 * largest_submodule);  // so building it whole would fail the bound
}

TEST(DeferredInitTest, InitialisationOrderAndPlaceDoNotMatter) {
  torch::manual_seed(5);
  GPTModule eager(small_gpt());
  const auto expected = clone_params(eager.module());
  torch::manual_seed(5);
  GPTModule deferred(small_gpt(), /*deferred=*/true);
  // Backwards, each parameter a view of one shared buffer (as FSDP does).
  auto named = deferred.module().named_parameters();
  int64_t total = 0;
  for (const auto& item : named) total += item.value().numel();
  auto buffer = torch::zeros({total + 3});
  int64_t offset = 3;
  for (const auto& item : named) {
    const auto& p = item.value();
    strata::replace_data(p, buffer.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  for (size_t i = named.size(); i-- > 0;) deferred.init_parameter(named[i].key(), named[i].value());
  expect_identical(expected, clone_params(deferred.module()));
  // A model built from another seed differs.
  torch::manual_seed(6);
  GPTModule other(small_gpt());
  EXPECT_FALSE(torch::equal(expected.front(), other.module().parameters().front()));
}

TEST(DeferredInitTest, SingleStrategyMaterialisesAndTrainsLikeEager) {
  auto train = [](bool deferred) {
    torch::manual_seed(3);
    GPTModule module(small_gpt(), deferred);
    // Installed on the deferred module, before setup, as strata-gpt does.
    strata::apply_activation_checkpointing(module, strata::ActivationCheckpointOptions().every_n(2));
    strata::testing::ToyData data;
    strata::Trainer(strata::TrainerOptions().max_steps(3).batch_size(4).lr(1e-2).warmup_steps(1).limit_val_batches(0),
                    std::make_shared<strata::SingleDeviceStrategy>(), {})
        .fit(module, data);
    return clone_params(module.module());
  };
  expect_identical(train(false), train(true));
}

TEST(DeferredInitTest, ModuleWithoutInitParameterIsAnErrorNamingTheParameter) {
  strata::testing::MlpStackModule module(8, 4, 2);
  strata::defer_parameters(module.module());
  strata::SingleDeviceStrategy strategy;
  try {
    strategy.setup(module);
    FAIL() << "setup accepted a deferred module without init_parameter";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    EXPECT_NE(what.find("parameter embed.weight [8, 4] is deferred (meta device)"), std::string::npos) << what;
    EXPECT_NE(what.find("init_parameter"), std::string::npos) << what;
  }
}

}  // namespace
