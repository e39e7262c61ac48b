// trainer_test - Unit tests for trainer/trainer.cpp (single process)
#include "strata/trainer/trainer.h"

#include "strata/recipes/models/gpt/gpt.h"
#include "strata/trainer/resume_state.h"
#include "strata/strategies/single/single_device.h"
#include "tests/error_text.h"
#include "tests/toy_data.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

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
  struct Losses : strata::Callback {
    std::string name() const override { return "Losses"; }
    void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics& s) override {
      losses.push_back(s.loss);
    }
    std::vector<double> losses;
  };
  auto losses = std::make_shared<Losses>();
  strata::Trainer trainer(strata::TrainerOptions().max_steps(40).batch_size(16).lr(1e-2).limit_val_batches(2),
                          std::make_shared<strata::SingleDeviceStrategy>(), {losses});
  auto result = trainer.fit(module, data);
  EXPECT_EQ(result.steps, 40);
  // The loss the title names: it starts near chance (ln 16) and falls well
  // below it; the result reports the last step's.
  ASSERT_EQ(losses->losses.size(), 40u);
  EXPECT_NEAR(losses->losses.front(), std::log(16.0), 0.5);
  EXPECT_LT(losses->losses.back(), 0.25 * losses->losses.front());
  EXPECT_DOUBLE_EQ(result.final_train_loss, losses->losses.back());
  ASSERT_TRUE(result.val_loss.has_value());
  ASSERT_TRUE(result.val_accuracy.has_value());
  // Validation recomputed here from the trained model: the mean token loss
  // and the share of samples predicted right at every position, over the
  // same two held-out batches.
  torch::NoGradGuard no_grad;
  module.module().eval();
  double loss_sum = 0.0, tokens = 0.0, right = 0.0, samples = 0.0;
  for (int64_t i = 0; i < 2; ++i) {
    const auto batch = data.val_batch(i, 16, strata::ShardInfo{});
    const auto logits = module.model()->forward(batch.input);
    loss_sum += torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.target.reshape({-1}),
                                                     torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    tokens += static_cast<double>(batch.target.numel());
    right += logits.argmax(-1).eq(batch.target).all(1).sum().item<double>();
    samples += static_cast<double>(batch.input.size(0));
  }
  EXPECT_NEAR(*result.val_loss, loss_sum / tokens, 1e-5);
  EXPECT_DOUBLE_EQ(*result.val_accuracy, right / samples);
  EXPECT_LT(*result.val_loss, std::log(16.0) * 0.5);  // well below chance
  EXPECT_GT(*result.val_accuracy, 0.5) << "the toy sequence is learnable: most samples right after 40 steps";
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

// ---- exact resume ------------------------------------------------------------

/// Records every step's loss; saves a checkpoint into `dir` after step `at`.
class LossRecorder : public strata::Callback {
 public:
  LossRecorder(std::string dir = "", int64_t at = -1) : dir_(std::move(dir)), at_(at) {}
  std::string name() const override { return "LossRecorder"; }
  void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics& m) override {
    losses[m.step] = m.loss;
  }
  void on_train_step_end(strata::Trainer& t, strata::TrainingModule&, int64_t step) override {
    if (step == at_) t.save_checkpoint(dir_);
  }
  std::map<int64_t, double> losses;

 private:
  std::string dir_;
  int64_t at_;
};

/// Draws from the default generator at fit start, as a callback may (a
/// resume must restore the generators after such draws).
class DrawsAtFitStart : public strata::Callback {
 public:
  std::string name() const override { return "DrawsAtFitStart"; }
  void on_fit_start(strata::Trainer&, strata::TrainingModule&) override { torch::rand({64}); }
};

GPTModule make_dropout_module(uint64_t seed) {
  torch::manual_seed(seed);
  return GPTModule(strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).dropout(0.2));
}

std::filesystem::path scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("strata-resume-" + std::to_string(::getpid()) + "-" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(TrainerResumeTest, DropoutRunResumesBitIdentically) {
  strata::testing::ToyData data;
  const auto options = strata::TrainerOptions().max_steps(6).batch_size(4).accumulate_grad_batches(2)
                           .lr(1e-2).warmup_steps(2).limit_val_batches(0);
  const auto dir = scratch_dir("dropout");
  auto straight = make_dropout_module(3);
  auto recorder = std::make_shared<LossRecorder>(dir.string(), 3);
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(),
                  {std::make_shared<DrawsAtFitStart>(), recorder}).fit(straight, data);
  ASSERT_EQ(recorder->losses.size(), 6u);

  // The test can fail: dropout masks drawn from another generator state change the losses.
  auto reseeded = make_dropout_module(3);
  torch::manual_seed(777);
  auto other = std::make_shared<LossRecorder>();
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(), {other}).fit(reseeded, data);
  EXPECT_NE(other->losses.at(1), recorder->losses.at(1));

  // Resumed from step 3 with another init and a scrambled generator: steps
  // 4..6 and the final parameters are the uninterrupted run's, bit for bit.
  auto resumed = make_dropout_module(99);
  torch::manual_seed(12345);
  auto after = std::make_shared<LossRecorder>();
  strata::Trainer trainer(strata::TrainerOptions(options).resume_from(dir.string()),
                          std::make_shared<strata::SingleDeviceStrategy>(),
                          {std::make_shared<DrawsAtFitStart>(), after});
  EXPECT_EQ(trainer.fit(resumed, data).steps, 6);
  EXPECT_EQ(trainer.micro_batches(), 12);
  ASSERT_EQ(after->losses.size(), 3u);
  for (int64_t step = 4; step <= 6; ++step) EXPECT_EQ(after->losses.at(step), recorder->losses.at(step)) << step;
  auto a = straight.module().parameters();
  auto b = resumed.module().parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
  std::filesystem::remove_all(dir);
}

TEST(TrainerResumeTest, DataPositionIsKeptInSamples) {
  // Saved with batch 4 x accumulation 2; resumed with batch 8 x accumulation
  // 1 (the same global batch): it continues at micro-batch 3 * 8 / 8 = 3.
  strata::testing::ToyData data;
  const auto options = strata::TrainerOptions().max_steps(3).batch_size(4).accumulate_grad_batches(2)
                           .limit_val_batches(0);
  const auto dir = scratch_dir("position");
  auto module = make_module();
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(),
                  {std::make_shared<LossRecorder>(dir.string(), 3)}).fit(module, data);
  auto again = make_module();
  strata::Trainer wider(strata::TrainerOptions(options).max_steps(4).batch_size(8).accumulate_grad_batches(1)
                            .resume_from(dir.string()),
                        std::make_shared<strata::SingleDeviceStrategy>());
  wider.fit(again, data);
  EXPECT_EQ(wider.micro_batches(), 4);
  // Batch 5 does not divide the 24 samples seen: a clear error naming both.
  auto third = make_module();
  const std::string error = strata::testing::what_of([&] {
    strata::Trainer(strata::TrainerOptions(options).max_steps(4).batch_size(5).resume_from(dir.string()),
                    std::make_shared<strata::SingleDeviceStrategy>()).fit(third, data);
  });
  EXPECT_NE(error.find("after 24 training samples"), std::string::npos) << error;
  EXPECT_NE(error.find("batch_size 5"), std::string::npos) << error;
  std::filesystem::remove_all(dir);
}

TEST(TrainerResumeTest, ResumeAtOrBeyondMaxStepsIsAnError) {
  strata::testing::ToyData data;
  const auto options = strata::TrainerOptions().max_steps(2).batch_size(4).limit_val_batches(0);
  const auto dir = scratch_dir("done");
  auto module = make_module();
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(),
                  {std::make_shared<LossRecorder>(dir.string(), 2)}).fit(module, data);
  for (int64_t max_steps : {2, 1}) {
    auto again = make_module();
    const std::string error = strata::testing::what_of([&] {
      strata::Trainer(strata::TrainerOptions(options).max_steps(max_steps).resume_from(dir.string()),
                      std::make_shared<strata::SingleDeviceStrategy>()).fit(again, data);
    });
    EXPECT_NE(error.find("is at step 2, not below max_steps " + std::to_string(max_steps)), std::string::npos)
        << error;
  }
  std::filesystem::remove_all(dir);
}

/// Counts steps across fits; resets in on_fit_start like a callback made for one fit.
class StepCounter : public strata::Callback {
 public:
  explicit StepCounter(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  void on_fit_start(strata::Trainer&, strata::TrainingModule&) override { count = 0; }
  void on_train_batch_end(strata::Trainer&, strata::TrainingModule&, const strata::StepMetrics&) override {
    count += increment;
  }
  std::string state_dict() const override { return std::to_string(count); }
  void load_state_dict(const std::string& state) override { count = std::stoll(state); }
  int64_t count = 0;
  int64_t increment = 1;

 private:
  std::string name_;
};

TEST(TrainerResumeTest, CallbackStatesAreRestoredAfterFitStartUnderTheirNames) {
  strata::testing::ToyData data;
  const auto options = strata::TrainerOptions().max_steps(5).batch_size(4).limit_val_batches(0);
  const auto dir = scratch_dir("callbacks");
  auto module = make_module();
  // Two callbacks with one name: saved apart ("Counter", "Counter#2").
  auto a = std::make_shared<StepCounter>("Counter");
  auto b = std::make_shared<StepCounter>("Counter");
  b->increment = 10;
  strata::Trainer(options, std::make_shared<strata::SingleDeviceStrategy>(),
                  {a, b, std::make_shared<LossRecorder>(dir.string(), 3)}).fit(module, data);
  EXPECT_EQ(a->count, 5);
  auto a2 = std::make_shared<StepCounter>("Counter");
  auto b2 = std::make_shared<StepCounter>("Counter");
  b2->increment = 10;
  auto again = make_module();
  strata::Trainer(strata::TrainerOptions(options).resume_from(dir.string()),
                  std::make_shared<strata::SingleDeviceStrategy>(), {a2, b2}).fit(again, data);
  EXPECT_EQ(a2->count, 5);   // 3 restored + 2 run
  EXPECT_EQ(b2->count, 50);  // 30 restored + 20 run
  std::filesystem::remove_all(dir);
}

TEST(TrainerResumeTest, GeneratorStateRoundTripsAndResumeSeedsDifferPerRank) {
  const torch::Device cpu(torch::kCPU);
  torch::manual_seed(5);
  const auto state = strata::capture_rng_state(cpu);
  const auto first = torch::rand({4});
  torch::manual_seed(6);
  strata::restore_rng_state(strata::tensor_of(strata::bytes_of(state)), cpu);
  EXPECT_TRUE(torch::equal(torch::rand({4}), first));
  EXPECT_THROW(strata::restore_rng_state(state.narrow(0, 0, 16), cpu), c10::Error);
  EXPECT_EQ(strata::resume_seed(1337, 10, 1), strata::resume_seed(1337, 10, 1));
  EXPECT_NE(strata::resume_seed(1337, 10, 0), strata::resume_seed(1337, 10, 1));
  EXPECT_NE(strata::resume_seed(1337, 10, 0), strata::resume_seed(1337, 11, 0));
}
}  // namespace
