// gpt_test - Unit tests for recipes/models/gpt.cpp
#include "strata/recipes/models/gpt/gpt.h"

#include "strata/strategies/single/single_device.h"
#include "tests/toy_data.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {
using strata::recipes::GPTModule;
using strata::recipes::GPTOptions;

GPTOptions nano(int64_t vocab = 16, int64_t block = 8) {
  return strata::recipes::gpt_preset("gpt-nano").vocab_size(vocab).block_size(block);
}

TEST(GPTTest, ChangingAFutureTokenNeverChangesEarlierLogits) {
  torch::manual_seed(0);
  GPTModule module(nano(16, 12));
  module.module().eval();
  torch::NoGradGuard no_grad;
  auto idx = torch::randint(0, 16, {2, 12}, torch::kInt64);
  auto base = module.model()(idx);
  for (int64_t t = 0; t < 12; ++t) {
    auto changed = idx.clone();
    changed.index_put_({torch::indexing::Slice(), t}, (idx.index({torch::indexing::Slice(), t}) + 1) % 16);
    auto out = module.model()(changed);
    if (t > 0) {
      EXPECT_TRUE(torch::equal(out.narrow(1, 0, t), base.narrow(1, 0, t))) << "position " << t;
    }
    EXPECT_FALSE(torch::allclose(out.narrow(1, t, 1), base.narrow(1, t, 1))) << "position " << t;
  }
}

TEST(GPTTest, TrainingAndValidationCallEveryBlockThroughTheUnitSeam) {
  torch::manual_seed(0);
  GPTModule module(nano());
  const auto units = module.wrap_units();
  ASSERT_EQ(units.size(), 3u);
  for (size_t i = 0; i < units.size(); ++i) EXPECT_EQ(units[i].get(), module.model()->blocks()[i].ptr().get());
  std::vector<int64_t> calls;
  module.set_unit_runner([&](int64_t unit, const torch::Tensor& x, const strata::UnitFn& forward) {
    calls.push_back(unit);
    return forward(x);
  });
  strata::testing::ToyData data;
  const auto batch = data.train_batch(0, 2, strata::ShardInfo{});
  const auto loss = module.training_step(batch);
  EXPECT_EQ(calls, (std::vector<int64_t>{0, 1, 2}));
  {
    torch::NoGradGuard no_grad;
    module.validation_step(batch);
  }
  EXPECT_EQ(calls, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  // A pass-through runner changes nothing: same loss as the bare model.
  auto logits = module.model()(batch.input);
  auto bare = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                   batch.target.reshape({-1}));
  EXPECT_TRUE(torch::equal(loss, bare));
  // A runner that changes the unit's output changes the model's output.
  module.set_unit_runner([](int64_t, const torch::Tensor& x, const strata::UnitFn& forward) {
    return forward(x) * 0.5;
  });
  EXPECT_FALSE(torch::allclose(module.training_step(batch), loss));
}

TEST(GPTTest, PresetsAndValidation) {
  EXPECT_EQ(strata::recipes::gpt_preset("gpt2").n_embd(), 768);
  EXPECT_THROW(strata::recipes::gpt_preset("gpt-huge"), c10::Error);
  try {
    strata::recipes::validate(GPTOptions(2, 3, 100).vocab_size(10).block_size(4));
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("n_embd 100 is not divisible by n_head 3"),
              std::string::npos);
  }
}

TEST(GPTTest, Gpt2PresetHas124MParameters) {
  // GPT-2 small with tied embeddings and a 50257-token vocabulary: 124.4M.
  GPTModule module(strata::recipes::gpt_preset("gpt2").vocab_size(50257).block_size(1024));
  EXPECT_EQ(module.model()->num_params(), 124439808);
}

TEST(GPTTest, ExactMatchCountsOnlyScoredPositions) {
  torch::manual_seed(0);
  GPTModule module(nano());
  strata::Batch batch{torch::zeros({2, 8}, torch::kInt64), torch::full({2, 8}, -1, torch::kInt64)};
  torch::NoGradGuard no_grad;
  auto pred = module.model()(batch.input).argmax(-1);
  batch.target.index_put_({0, 7}, pred.index({0, 7}));                  // right
  batch.target.index_put_({1, 7}, (pred.index({1, 7}) + 1) % 16);       // wrong
  auto out = module.validation_step(batch);
  EXPECT_EQ(out.tokens, 2);
  EXPECT_EQ(out.samples, 2);
  EXPECT_EQ(out.correct_samples, 1);
}

// A golden 10-step loss trajectory for gpt-nano on ToyData (deterministic),
// with either attention core (they agree to ~1e-6, far inside the tolerance).
// Regenerate with STRATA_UPDATE_GOLDEN=1 after an intended numerical change.
void expect_golden_trajectory(const std::string& attention) {
  SCOPED_TRACE("attention " + attention);
  class Recorder : public strata::Callback {
   public:
    std::string name() const override { return "Recorder"; }
    void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics& m) override {
      losses.push_back(m.loss);
    }
    std::vector<double> losses;
  };
  torch::manual_seed(1234);
  GPTModule module(nano().attention(attention));
  strata::testing::ToyData data;
  auto recorder = std::make_shared<Recorder>();
  strata::Trainer trainer(strata::TrainerOptions().max_steps(10).batch_size(8).lr(1e-2).min_lr(1e-3)
                              .warmup_steps(2).limit_val_batches(0),
                          std::make_shared<strata::SingleDeviceStrategy>(), {recorder});
  trainer.fit(module, data);
  ASSERT_EQ(recorder->losses.size(), 10u);
  const std::string path = std::string(STRATA_SOURCE_DIR) + "/tests/golden/gpt_nano_toy_10_steps.txt";
  if (std::getenv("STRATA_UPDATE_GOLDEN") != nullptr && attention == "naive") {
    std::ofstream out(path);
    out.precision(9);
    for (double l : recorder->losses) out << l << "\n";
    GTEST_SKIP() << "golden file rewritten (naive attention): " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing golden file " << path;
  std::vector<double> golden;
  for (double v; in >> v;) golden.push_back(v);
  ASSERT_EQ(golden.size(), 10u);
  for (size_t i = 0; i < golden.size(); ++i) {
    // Tolerance covers BLAS differences between machines, not behaviour changes.
    EXPECT_NEAR(recorder->losses[i], golden[i], 1e-4 * std::max(1.0, golden[i])) << "step " << i + 1;
  }
  EXPECT_LT(recorder->losses.back(), recorder->losses.front());
}

TEST(GPTTest, GoldenLossTrajectoryGptNano) {
  expect_golden_trajectory("naive");
  if (::testing::Test::IsSkipped()) return;
  expect_golden_trajectory("fused");
}

}  // namespace
