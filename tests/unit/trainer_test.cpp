// trainer_test - Unit tests for trainer/trainer.cpp (single process)
#include "trainer/trainer.h"

#include "recipes/gpt.h"
#include "strategies/single_device.h"
#include "tests/error_text.h"
#include "tests/toy_data.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>

namespace {
using strata::recipes::GPTModule;

GPTModule make_module(uint64_t seed = 3) {
  torch::manual_seed(seed);
  return GPTModule(strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8));
}

/// Captures every gradient just before the first optimizer step.
class GradCapture : public strata::Callback {
 public:
  std::string name() const override { return "GradCapture"; }
  void on_before_optimizer_step(strata::Trainer&, strata::TrainingModule& m, torch::optim::Optimizer&) override {
    if (!grads.empty()) return;
    for (const auto& p : m.module().parameters()) grads.push_back(p.grad().clone());
  }
  void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics& s) override {
    norms.push_back(s.grad_norm);
  }
  std::vector<torch::Tensor> grads;
  std::vector<double> norms;
};

std::vector<torch::Tensor> first_step_grads(int64_t batch, int64_t accum, double clip = 0.0,
                                            std::vector<double>* norms = nullptr) {
  auto module = make_module();
  strata::testing::ToyData data;
  auto capture = std::make_shared<GradCapture>();
  strata::Trainer trainer(strata::TrainerOptions().max_steps(1).batch_size(batch)
                              .accumulate_grad_batches(accum).gradient_clip_val(clip).limit_val_batches(0),
                          std::make_shared<strata::SingleDeviceStrategy>(), {capture});
  trainer.fit(module, data);
  if (norms) *norms = capture->norms;
  return capture->grads;
}

TEST(TrainerTest, GradientAccumulationEqualsOneLargerBatch) {
  const auto big = first_step_grads(/*batch=*/12, /*accum=*/1);
  for (int64_t k : {2, 3, 4}) {
    const auto accumulated = first_step_grads(12 / k, k);
    ASSERT_EQ(big.size(), accumulated.size());
    for (size_t i = 0; i < big.size(); ++i) {
      EXPECT_TRUE(torch::allclose(big[i], accumulated[i], /*rtol=*/1e-5, /*atol=*/1e-6))
          << "k=" << k << " param " << i << " max diff " << (big[i] - accumulated[i]).abs().max().item<double>();
    }
  }
}

TEST(TrainerTest, ClipsToGlobalNormAndReportsNormBeforeClipping) {
  std::vector<double> norms;
  const auto raw = first_step_grads(8, 1, /*clip=*/0.0, &norms);
  double manual = 0.0;
  for (const auto& g : raw) manual += g.to(torch::kFloat64).pow(2).sum().item<double>();
  manual = std::sqrt(manual);
  ASSERT_EQ(norms.size(), 1u);
  EXPECT_NEAR(norms[0], manual, 1e-6 * manual);

  const double max_norm = manual / 4.0;
  std::vector<double> clipped_norms;
  const auto clipped = first_step_grads(8, 1, max_norm, &clipped_norms);
  EXPECT_NEAR(clipped_norms[0], manual, 1e-6 * manual);  // reported before clipping
  double after = 0.0;
  for (size_t i = 0; i < clipped.size(); ++i) {
    after += clipped[i].to(torch::kFloat64).pow(2).sum().item<double>();
    // Clipping scales every gradient by the same coefficient.
    EXPECT_TRUE(torch::allclose(clipped[i], raw[i] * (max_norm / (manual + 1e-6)), 1e-5, 1e-7)) << i;
  }
  EXPECT_NEAR(std::sqrt(after), max_norm, 1e-5 * max_norm);
}

TEST(TrainerTest, LossDecreasesAndValidationReportsAccuracy) {
  auto module = make_module();
  strata::testing::ToyData data;
  strata::Trainer trainer(strata::TrainerOptions().max_steps(40).batch_size(16).lr(1e-2).limit_val_batches(2),
                          std::make_shared<strata::SingleDeviceStrategy>());
  auto result = trainer.fit(module, data);
  EXPECT_EQ(result.steps, 40);
  ASSERT_TRUE(result.val_loss.has_value());
  ASSERT_TRUE(result.val_accuracy.has_value());
  EXPECT_LT(*result.val_loss, std::log(16.0) * 0.5);  // well below chance
  EXPECT_GE(*result.val_accuracy, 0.0);
  ASSERT_EQ(result.model_state_bytes.size(), 1u);
  // fp32 AdamW: params 4 B, grads 4 B, state 8 B per parameter.
  const int64_t n = module.model()->num_params();
  EXPECT_EQ(result.model_state_bytes[0].params, 4 * n);
  EXPECT_EQ(result.model_state_bytes[0].grads, 4 * n);
  EXPECT_EQ(result.model_state_bytes[0].optimizer, 8 * n);
}

TEST(TrainerTest, RejectsBadOptions) {
  auto strategy = std::make_shared<strata::SingleDeviceStrategy>();
  EXPECT_THROW(strata::Trainer(strata::TrainerOptions().max_steps(0), strategy), c10::Error);
  EXPECT_THROW(strata::Trainer(strata::TrainerOptions().batch_size(-1), strategy), c10::Error);
  EXPECT_THROW(strata::Trainer(strata::TrainerOptions().accumulate_grad_batches(0), strategy), c10::Error);
  EXPECT_THROW(strata::Trainer(strata::TrainerOptions().lr(0.0), strategy), c10::Error);
  const std::string error = strata::testing::what_of(
      [&] { strata::Trainer(strata::TrainerOptions().optimizer("adam"), strategy); });
  EXPECT_NE(error.find("unknown optimizer 'adam'; available: adamw, sgd"), std::string::npos) << error;
}

TEST(TrainerTest, SgdStepIsLrTimesGradientPlusDecayOnMatricesOnly) {
  // One plain-SGD step: p' = p - lr * (g + wd * p) for >= 2-D weights, and
  // p' = p - lr * g for biases and LayerNorm weights (nanoGPT's groups).
  // Linear in g: that is what lets the parity tests see the gradient's scale.
  const double lr = 0.25, wd = 0.1;
  auto module = make_module();
  std::vector<torch::Tensor> before;
  for (const auto& p : module.module().parameters()) before.push_back(p.detach().clone());
  strata::testing::ToyData data;
  auto capture = std::make_shared<GradCapture>();
  strata::Trainer trainer(strata::TrainerOptions().optimizer("sgd").max_steps(1).batch_size(4)
                              .lr(lr).min_lr(lr).weight_decay(wd).limit_val_batches(0),
                          std::make_shared<strata::SingleDeviceStrategy>(), {capture});
  trainer.fit(module, data);
  ASSERT_EQ(capture->grads.size(), before.size());
  int decayed = 0, plain = 0;
  size_t i = 0;
  for (const auto& p : module.module().parameters()) {
    const double decay = p.dim() >= 2 ? wd : 0.0;
    (p.dim() >= 2 ? decayed : plain) += 1;
    const auto expected = before[i] - lr * (capture->grads[i] + decay * before[i]);
    EXPECT_TRUE(torch::allclose(p.detach(), expected, /*rtol=*/1e-6, /*atol=*/1e-7))
        << "param " << i << " max diff " << (p.detach() - expected).abs().max().item<double>();
    ++i;
  }
  EXPECT_GT(decayed, 0);
  EXPECT_GT(plain, 0);
  EXPECT_EQ(strata::optimizer_state_bytes(*trainer.optimizer()), 0);  // no momentum buffers
}

TEST(TrainerTest, CheckpointResumeReproducesUninterruptedRun) {
  strata::testing::ToyData data;
  auto options = strata::TrainerOptions().max_steps(6).batch_size(8).lr(1e-2).limit_val_batches(0);
  auto straight = make_module();
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>()).fit(straight, data);

  const auto dir = std::filesystem::temp_directory_path() / ("strata-ckpt-" + std::to_string(::getpid()));
  // Stop after 3 of 6 steps (same LR schedule as the uninterrupted run).
  class StopAtThree : public strata::Callback {
   public:
    std::string name() const override { return "StopAtThree"; }
    void on_train_batch_end(strata::Trainer& t, strata::TrainingModule&, const strata::StepMetrics& m) override {
      if (m.step == 3) t.request_stop("test");
    }
  };
  auto first = make_module();
  strata::Trainer first_half(options, std::make_shared<strata::SingleDeviceStrategy>(),
                             {std::make_shared<StopAtThree>()});
  first_half.fit(first, data);
  first_half.save_checkpoint(dir.string());

  auto resumed = make_module(/*seed=*/99);  // different init: everything must come from the checkpoint
  strata::Trainer second_half(strata::TrainerOptions(options).resume_from(dir.string()),
                              std::make_shared<strata::SingleDeviceStrategy>());
  auto result = second_half.fit(resumed, data);
  EXPECT_EQ(result.steps, 6);
  auto a = straight.module().parameters();
  auto b = resumed.module().parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-6, 1e-7)) << i;

  // AdamW state cannot seed SGD (or the reverse): a clear error, not torch's
  // internal assert deep in SGD::load.
  auto other = make_module();
  const std::string error = strata::testing::what_of([&] {
    strata::Trainer(strata::TrainerOptions(options).optimizer("sgd").resume_from(dir.string()),
                    std::make_shared<strata::SingleDeviceStrategy>())
        .fit(other, data);
  });
  EXPECT_NE(error.find("holds adamw optimizer state but this run's optimizer is sgd"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}
}  // namespace
