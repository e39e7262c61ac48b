// executor_test - a pipeline step (strategies/pp/executor.h) on ranks as
// threads, every schedule, against one process: the micro-batches' losses
// and every parameter's gradient equal one process's on the whole step.
#include "strata/strategies/pp/executor.h"
#include "strata/strategies/thread_world.h"

#include <gtest/gtest.h>

#include <mutex>

namespace {

using strata::pp::ExecutorOptions;
using strata::pp::ScheduleOptions;

constexpr int64_t kBatch = 4, kWidth = 8;

/// A stage of an MLP: Linear + tanh; the last adds a head and the MSE loss.
class MlpStage : public strata::pp::Stage {
 public:
  MlpStage(bool last) : last_(last) {
    body_ = torch::nn::Sequential(torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh());
    if (last) body_->push_back(torch::nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(const torch::Tensor& input, const torch::Tensor& target) override {
    const auto y = body_->forward(input);
    return last_ ? torch::mse_loss(y, target) : y;
  }
  std::vector<torch::Tensor> parameters() override { return body_->parameters(); }

 private:
  bool last_;
  torch::nn::Sequential body_;
};

/// The model's stages, the same on every rank and in the reference (seeded).
std::vector<std::unique_ptr<MlpStage>> make_stages(int count) {
  torch::manual_seed(7);
  std::vector<std::unique_ptr<MlpStage>> out;
  for (int s = 0; s < count; ++s) out.push_back(std::make_unique<MlpStage>(s + 1 == count));
  return out;
}

strata::pp::StepInputs make_inputs(int microbatches) {
  torch::manual_seed(11);
  strata::pp::StepInputs in;
  for (int i = 0; i < microbatches; ++i) {
    in.inputs.push_back(torch::randn({kBatch, kWidth}));
    in.targets.push_back(torch::randn({kBatch, kWidth}));
  }
  return in;
}

/// One process: each micro-batch through every stage, the mean loss's backward.
std::pair<std::vector<double>, std::vector<torch::Tensor>> reference(int stages, const strata::pp::StepInputs& in) {
  auto model = make_stages(stages);
  std::vector<double> losses;
  for (size_t i = 0; i < in.inputs.size(); ++i) {
    torch::Tensor x = in.inputs[i];
    for (int s = 0; s + 1 < stages; ++s) x = model[s]->forward(x, {});
    const auto loss = model[stages - 1]->forward(x, in.targets[i]);
    losses.push_back(loss.item<double>());
    (loss / double(in.inputs.size())).backward();
  }
  std::vector<torch::Tensor> grads;
  for (auto& stage : model)
    for (auto& p : stage->parameters()) grads.push_back(p.grad().clone());
  return {losses, grads};
}

void expect_step_equals_one_process(const std::string& name, const ScheduleOptions& o) {
  const auto schedule = strata::pp::make_schedule(name, o);
  const auto in = make_inputs(o.microbatches());
  const auto [want_losses, want_grads] = reference(schedule->stages(), in);
  std::mutex mu;
  std::map<int, std::vector<torch::Tensor>> grads_by_stage;
  std::vector<double> losses;
  // Built once, here: seeding the global generator on every rank's thread at
  // once would race. Each rank touches only its own stages.
  auto all = make_stages(schedule->stages());
  strata::run_thread_world(o.ranks(), [&](strata::Comm& comm) {
    std::map<int, strata::pp::Stage*> mine;
    for (int s = 0; s < schedule->stages(); ++s)
      if (schedule->rank_of(s) == comm.rank()) mine[s] = all[s].get();
    const auto got = strata::pp::run_pipeline_step(*schedule, mine, in, comm,
                                                   ExecutorOptions().activation_shape({kBatch, kWidth}));
    std::lock_guard<std::mutex> lock(mu);
    if (!got.empty()) losses = got;
    for (auto& [s, stage] : mine)
      for (auto& p : stage->parameters()) grads_by_stage[s].push_back(p.grad().defined() ? p.grad().clone() : p.grad());
  });
  ASSERT_EQ(losses.size(), want_losses.size()) << name;
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], want_losses[i], 1e-6) << name << " micro-batch " << i;
  size_t k = 0;
  for (auto& [s, grads] : grads_by_stage) {
    for (auto& g : grads) {
      ASSERT_TRUE(g.defined()) << name << " stage " << s << ": no gradient";
      EXPECT_TRUE(torch::allclose(g, want_grads[k], 1e-5, 1e-7))
          << name << " stage " << s << " parameter " << k << ": max difference "
          << (g - want_grads[k]).abs().max().item<double>();
      ++k;
    }
  }
  EXPECT_EQ(k, want_grads.size()) << name;
}

TEST(PipelineExecutorTest, EveryScheduleGivesOneProcesssGradients) {
  expect_step_equals_one_process("gpipe", ScheduleOptions().ranks(2).microbatches(4));
  expect_step_equals_one_process("1f1b", ScheduleOptions().ranks(2).microbatches(4));
  expect_step_equals_one_process("1f1b", ScheduleOptions().ranks(4).microbatches(8));
  expect_step_equals_one_process("interleaved-1f1b", ScheduleOptions().ranks(2).microbatches(4).virtual_stages(2));
  expect_step_equals_one_process("zero-bubble", ScheduleOptions().ranks(2).microbatches(4));
  expect_step_equals_one_process("zero-bubble", ScheduleOptions().ranks(4).microbatches(8));
}

}  // namespace
