// gpt_pipeline_test - the GPT cut into pipeline stages (GPTModule as a
// pp::PipelineModel, each rank's a pp::StageModule) and run by the executor
// on ranks as threads: every micro-batch's loss and every
// parameter's gradient equal the whole GPT's in one process, the tied
// embedding's included once the first and last stage have summed theirs.
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/lm.h"
#include "strata/strategies/thread_world.h"

#include <gtest/gtest.h>

#include <mutex>

namespace {

using strata::pp::ScheduleOptions;
using strata::recipes::GPT;
using strata::recipes::GPTOptions;

constexpr int64_t kBatch = 2, kT = 8, kVocab = 32, kWidth = 16;

GPTOptions options(int64_t layers, bool tied) {
  return GPTOptions(layers, 2, kWidth).vocab_size(kVocab).block_size(kT).dropout(0.0).tie_weights(tied);
}

strata::pp::StepInputs batches(int microbatches) {
  torch::manual_seed(3);
  strata::pp::StepInputs in;
  for (int i = 0; i < microbatches; ++i) {
    in.inputs.push_back(torch::randint(kVocab, {kBatch, kT}, torch::kLong));
    in.targets.push_back(torch::randint(kVocab, {kBatch, kT}, torch::kLong));
  }
  return in;
}

struct Result {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> grads;
};

Result one_process(const GPTOptions& o, const strata::pp::StepInputs& in) {
  GPT model(o);
  Result r;
  for (size_t i = 0; i < in.inputs.size(); ++i) {
    const auto loss = strata::recipes::lm_loss(model->forward(in.inputs[i]), in.targets[i]);
    r.losses.push_back(loss.item<double>());
    (loss / double(in.inputs.size())).backward();
  }
  for (const auto& p : model->named_parameters()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

void expect_pipeline_equals_one_process(const std::string& schedule_name, const ScheduleOptions& so, bool tied) {
  const auto schedule = strata::pp::make_schedule(schedule_name, so);
  const auto o = options(2 * schedule->stages(), tied);
  const auto in = batches(so.microbatches());
  const Result want = one_process(o, in);
  // One GPT per rank, built here (the same weights: GPT's init is seeded per
  // parameter name), each cut to its rank's stages.
  std::vector<std::unique_ptr<strata::pp::StageModule>> modules;
  for (int r = 0; r < so.ranks(); ++r) {
    auto whole = std::make_unique<strata::recipes::GPTModule>(o);
    const auto cuts = strata::pp::stage_cuts(*whole, schedule->stages());
    std::vector<int> held;
    for (int s = 0; s < schedule->stages(); ++s) {
      if (schedule->rank_of(s) == r) held.push_back(s);
    }
    modules.push_back(std::make_unique<strata::pp::StageModule>(std::move(whole), cuts, held));
  }
  std::mutex mu;
  Result got;
  std::map<std::string, int> owners;
  std::vector<int> backwards_done(size_t(so.ranks()), 0);
  strata::run_thread_world(so.ranks(), [&](strata::Comm& comm) {
    auto& mine = *modules[size_t(comm.rank())];
    int& done = backwards_done[size_t(comm.rank())];
    const auto losses = strata::pp::run_pipeline_step(
        *schedule, mine.stages(), in, comm,
        strata::pp::ExecutorOptions().activation_shape({kBatch, kT, kWidth}).on_backward_done([&done] { ++done; }));
    const auto params = mine.module().named_parameters();
    if (tied && params.contains("wte.weight")) {
      strata::pp::exchange_tied_gradient(params["wte.weight"], 0, schedule->rank_of(schedule->stages() - 1), comm);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!losses.empty()) got.losses = losses;
    for (const auto& p : params) {
      ++owners[p.key()];
      got.grads[p.key() + "@" + std::to_string(comm.rank())] = p.value().grad().clone();
    }
  });
  const std::string what = schedule_name + " P " + std::to_string(so.ranks()) + (tied ? " tied" : " untied");
  // The Trainer's on_after_backward: once per micro-batch on every rank.
  for (int r = 0; r < so.ranks(); ++r) EXPECT_EQ(backwards_done[size_t(r)], so.microbatches()) << what << ", rank " << r;
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5) << what;
  for (const auto& [name, grad] : want.grads) EXPECT_GE(owners[name], 1) << what << ": no stage holds " << name;
  for (const auto& [key, grad] : got.grads) {
    const auto& ref = want.grads.at(key.substr(0, key.find('@')));
    EXPECT_TRUE(torch::allclose(grad, ref, 1e-4, 1e-6))
        << what << " " << key << ": max difference " << (grad - ref).abs().max().item<double>();
  }
}

TEST(GptPipelineTest, StagesUnderEveryScheduleGiveTheWholeModelsGradients) {
  expect_pipeline_equals_one_process("1f1b", ScheduleOptions().ranks(2).microbatches(4), /*tied=*/true);
  expect_pipeline_equals_one_process("gpipe", ScheduleOptions().ranks(2).microbatches(2), /*tied=*/false);
  expect_pipeline_equals_one_process("zero-bubble", ScheduleOptions().ranks(4).microbatches(4), /*tied=*/true);
  expect_pipeline_equals_one_process("interleaved-1f1b", ScheduleOptions().ranks(2).microbatches(2).virtual_stages(2),
                                     /*tied=*/true);
}

TEST(GptPipelineTest, BalancedSplitsCountTheEmbeddingAndTheHead) {
  using R = std::vector<strata::pp::UnitRange>;
  EXPECT_EQ(strata::pp::balanced_split({1, 1, 1, 1}, 2), (R{{0, 2}, {2, 4}}));
  // A heavy head: the last stage takes fewer blocks.
  EXPECT_EQ(strata::pp::balanced_split({1, 1, 1, 1, 1, 1}, 2, 0.0, 2.0), (R{{0, 4}, {4, 6}}));
  EXPECT_EQ(strata::pp::balanced_split(std::vector<double>(8, 1.0), 4, 0.5, 1.5), (R{{0, 2}, {2, 4}, {4, 7}, {7, 8}}));
  EXPECT_EQ(strata::pp::parse_split("1,3", 4, 2), (R{{0, 1}, {1, 4}}));
  EXPECT_THROW(strata::pp::parse_split("2,3", 4, 2), c10::ValueError);
  EXPECT_THROW(strata::pp::parse_split("4,0", 4, 2), c10::ValueError);
  EXPECT_THROW(strata::pp::balanced_split({1, 1}, 3), c10::ValueError);
}

}  // namespace
