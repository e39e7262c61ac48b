// gpt_tp_test - the GPT's tensor-parallel forward and backward (ranks as
// threads over Gloo) against the same GPT unsplit: the loss, and every
// parameter's gradient gathered back into the whole, at 2 and 3 ranks, with
// and without sequence parallelism. Uneven vocabulary (13 over 2 and 3).
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/strategies/thread_world.h"
#include "strata/strategies/tp/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using strata::Comm;
using strata::recipes::GPTModule;
using strata::recipes::GPTOptions;

GPTOptions options() { return GPTOptions(2, 6, 24).vocab_size(13).block_size(6); }

strata::Batch batch() {
  torch::manual_seed(11);
  return {torch::randint(13, {3, 6}, torch::kLong), torch::randint(13, {3, 6}, torch::kLong)};
}

void expect_same_as_unsplit(int ranks, bool sequence_parallel) {
  // Everything random before the ranks start: their threads share torch's
  // default generator, which a GPT's construction reads its seed from.
  const strata::Batch data = batch();
  torch::manual_seed(5);
  GPTModule whole(options());
  std::vector<std::unique_ptr<GPTModule>> models;
  for (int r = 0; r < ranks; ++r) {
    torch::manual_seed(5);
    models.push_back(std::make_unique<GPTModule>(options()));
  }
  const auto loss = whole.training_step(data);
  loss.backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : whole.module().named_parameters()) grads[p.key()] = p.value().grad();

  strata::run_thread_world(ranks, [&](Comm& comm) {
    GPTModule& split = *models[comm.rank()];
    strata::tp::TensorParallel tp(comm, comm, strata::tp::TensorParallelOptions().sequence_parallel(sequence_parallel));
    tp.apply(split);
    const auto mine = split.training_step(data);
    EXPECT_NEAR(mine.item<double>(), loss.item<double>(), 1e-5) << "rank " << comm.rank();
    mine.backward();
    for (const auto& p : split.module().named_parameters()) {
      torch::Tensor g = p.value().grad();
      ASSERT_TRUE(g.defined()) << p.key();
      const auto shape = tp.global_shapes().find(p.key());
      if (shape != tp.global_shapes().end()) {
        g = strata::tp::shard_of(grads.at(p.key()), tp.layouts().at(p.key()), comm.rank(), ranks) - g;
      } else {
        g = grads.at(p.key()) - g;
      }
      EXPECT_LE(g.abs().max().item<double>(), 1e-5) << "rank " << comm.rank() << " " << p.key();
    }
  });
}

TEST(GptTensorParallelTest, LossAndGradientsEqualTheUnsplitModel) {
  expect_same_as_unsplit(2, false);
  expect_same_as_unsplit(3, false);
}

TEST(GptTensorParallelTest, SequenceParallelToo) {
  expect_same_as_unsplit(2, true);
  expect_same_as_unsplit(3, true);
}

/// A plan whose rule matches nothing (a path typo: "h.*" where the blocks are h0, h1).
struct TypoPlan : GPTModule {
  using GPTModule::GPTModule;
  strata::tp::Plan tensor_parallel_plan() const override {
    return {{"wte", strata::tp::Style::kVocab}, {"h.*.c_fc", strata::tp::Style::kColwise}};
  }
};

TEST(GptTensorParallelTest, APlanRuleThatMatchesNothingIsAnError) {
  strata::run_thread_world(2, [](Comm& comm) {
    TypoPlan model(options());
    strata::tp::TensorParallel tp(comm, comm);
    try {
      tp.apply(model);
      ADD_FAILURE() << "no error";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("rule 'h.*.c_fc' (colwise) matches no parameter"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
