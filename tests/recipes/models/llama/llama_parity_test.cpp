// llama_parity_test - every data-parallel strategy reproduces single-process
// training of the Llama family's decoder step by step (thread-ranks,
// strategies from the registry): llama-nano in small, grouped-query attention
// (3 query heads over 1 kv head), RMSNorm, SwiGLU, RoPE, q/k norms and q/k/v
// biases on, untied head. SGD is the scale check (a gradient N times too
// large or small moves every parameter and the logged norm by N); AdamW the
// recipe's optimizer. With activation checkpointing of every block under fsdp
// too, and tensor parallelism of grouped-query attention (tp 2, sequence
// parallel off and on; dp 2 x tp 2), with LoRA on all seven projections
// (fsdp, tp 2 with sequence parallelism) and under bf16-mixed. The control
// shows the tolerance sees one step of the wrong size.
#include "strata/recipes/models/llama/llama.h"
#include "strata/recipes/models/llama/spec.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/single/single_device.h"
#include "strata/strategies/thread_world.h"
#include "strata/strategies/tp/mesh.h"
#include "strata/strategies/tp/tensor_parallel.h"
#include "strata/trainer/trainer.h"
#include "tests/toy_data.h"

#include <gtest/gtest.h>

#include <iostream>
#include <mutex>

namespace {
using namespace strata;

struct TrainedRun {
  std::vector<torch::Tensor> params;
  std::vector<double> grad_norms;
  int64_t largest_part = 0;  ///< tensor parallel: the most parameter elements a rank holds after the split
};

class GradNorms : public Callback {
 public:
  std::string name() const override { return "GradNorms"; }
  void on_train_batch_end(Trainer&, TrainingModule&, const StepMetrics& m) override { norms.push_back(m.grad_norm); }
  std::vector<double> norms;
};

/// How the thread-ranks split (tp 1 is data parallelism alone) and which
/// model they train.
struct Split {
  int tp = 1;
  bool sequence_parallel = false;
  bool checkpoint = false;
  /// LoRA adapters of this rank on every projection (0: off).
  int64_t lora_rank = 0;
};

/// llama-nano's 3 query heads over 1 kv head; with `split_heads` 4 over 2
/// (whole kv heads per rank at tp 2). Either with q/k norms and q/k/v biases.
std::unique_ptr<recipes::LlamaModule> make_llama(bool checkpoint, bool split_heads = false, int64_t lora_rank = 0) {
  // Thread-ranks share torch's default generator, whose seed the model's
  // per-parameter init reads: seed and build under one lock.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  torch::manual_seed(11);
  auto o = split_heads ? recipes::LlamaOptions(2, 4, 48, 128).n_kv_head(2) : recipes::llama_preset("llama-nano");
  o.vocab_size(16).block_size(8).qk_norm(true).qkv_bias(true).lora_rank(lora_rank).lora_targets("all");
  auto m = std::make_unique<recipes::LlamaModule>(o);
  if (checkpoint) apply_activation_checkpointing(*m, ActivationCheckpointOptions().every_n(1));
  return m;
}

TrainerOptions options(const std::string& optimizer, int64_t batch, double lr) {
  return TrainerOptions().optimizer(optimizer).max_steps(10).batch_size(batch).gradient_clip_val(0.0).lr(lr)
      .min_lr(lr / 10).warmup_steps(2).limit_val_batches(0);
}

TrainedRun collect(TrainingModule& module, const GradNorms& norms) {
  TrainedRun out;
  for (const auto& p : module.module().parameters()) out.params.push_back(p.detach().clone());
  out.grad_norms = norms.norms;
  return out;
}

TrainedRun train_single(const TrainerOptions& o, bool checkpoint = false, bool split_heads = false,
                        int64_t lora_rank = 0) {
  auto module = make_llama(checkpoint, split_heads, lora_rank);
  strata::testing::ToyData data;
  auto norms = std::make_shared<GradNorms>();
  Trainer(o, std::make_shared<SingleDeviceStrategy>(), {norms}).fit(*module, data);
  return collect(*module, *norms);
}

/// `world` thread-ranks as dp (world / tp) x tp (tp innermost); `strategy`
/// over the data-parallel groups; rank 0's full parameters.
TrainedRun train_threads(const std::string& strategy, int world, const TrainerOptions& o, const Split& split = {}) {
  StrategyRegistry registry;
  register_builtin_strategies(registry);
  std::mutex mu;
  std::vector<TrainedRun> per_rank(world);
  run_thread_world(world, [&](Comm& comm) {
    auto module = make_llama(split.checkpoint, /*split_heads=*/split.tp > 1, split.lora_rank);
    Comm dp_group = comm;
    std::shared_ptr<tp::TensorParallel> parallel;
    if (split.tp > 1) {
      const auto mesh = tp::MeshDims::of(world, split.tp);
      // Collective: every rank makes the same two splits in the same order.
      Comm tp_group = comm.split("tp", mesh.tp_groups());
      dp_group = comm.split("dp", mesh.dp_groups());
      parallel = std::make_shared<tp::TensorParallel>(
          comm, tp_group, tp::TensorParallelOptions().sequence_parallel(split.sequence_parallel));
      parallel->apply(*module);
    }
    int64_t part = 0;
    for (const auto& p : module->module().parameters()) part += p.numel();
    std::shared_ptr<Strategy> s = registry.create(strategy, dp_group);
    if (parallel) s->set_model_parallel(parallel);
    strata::testing::ToyData data;
    auto norms = std::make_shared<GradNorms>();
    Trainer(o, s, {norms}).fit(*module, data);
    // FSDP and tp hold parts between steps: gather the full parameters to compare.
    auto full = s->full_params();
    std::lock_guard<std::mutex> lock(mu);
    per_rank[comm.rank()] = collect(*module, *norms);
    per_rank[comm.rank()].largest_part = part;
  }, std::chrono::seconds(60));
  for (const auto& r : per_rank) per_rank[0].largest_part = std::max(per_rank[0].largest_part, r.largest_part);
  return per_rank[0];
}

double max_diff(const TrainedRun& a, const TrainedRun& b) {
  EXPECT_EQ(a.params.size(), b.params.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.params.size(), b.params.size()); ++i) {
    d = std::max(d, (a.params[i] - b.params[i]).abs().max().item<double>());
  }
  return d;
}

// lr 0.1 as the GPT's gradient-scale tests (data_parallel_harness.h).
constexpr double kSgdLr = 0.1;

TEST(LlamaParityTest, EveryStrategyMatchesSingleStepByStepAtTwoAndThreeRanks) {
  for (int world : {2, 3}) {
    const TrainedRun sgd_ref = train_single(options("sgd", 2 * world, kSgdLr));
    const TrainedRun adam_ref = train_single(options("adamw", 2 * world, 1e-3));
    for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
      const std::string what = strategy + " x" + std::to_string(world);
      const TrainedRun sgd = train_threads(strategy, world, options("sgd", 2, kSgdLr));
      ASSERT_EQ(sgd.grad_norms.size(), 10u) << what;
      for (size_t step = 0; step < sgd.grad_norms.size(); ++step) {
        EXPECT_NEAR(sgd.grad_norms[step], sgd_ref.grad_norms[step], 1e-5 * sgd_ref.grad_norms[step])
            << what << " step " << step + 1;
      }
      EXPECT_LE(max_diff(sgd, sgd_ref), 1e-5) << what << " (sgd)";
      // 3e-5 for AdamW: an element whose gradient is rounding noise moves by a
      // noise-dependent fraction of lr (data_parallel_harness.h).
      EXPECT_LE(max_diff(train_threads(strategy, world, options("adamw", 2, 1e-3)), adam_ref), 3e-5) << what;
    }
  }
}

TEST(LlamaParityTest, FsdpWithEveryBlockCheckpointedMatchesSingle) {
  const TrainedRun ref = train_single(options("sgd", 4, kSgdLr), /*checkpoint=*/false);
  const TrainedRun got = train_threads("fsdp", 2, options("sgd", 2, kSgdLr), {.checkpoint = true});
  EXPECT_LE(max_diff(got, ref), 1e-5);
  for (size_t step = 0; step < got.grad_norms.size(); ++step) {
    EXPECT_NEAR(got.grad_norms[step], ref.grad_norms[step], 1e-5 * ref.grad_norms[step]) << "step " << step + 1;
  }
}

TEST(LlamaParityTest, TensorParallelGroupedQueryAttentionMatchesSingle) {
  struct Case {
    std::string strategy;
    int world, tp;
    bool sequence_parallel;
  };
  for (const auto& c : {Case{"single", 2, 2, false}, Case{"single", 2, 2, true}, Case{"ddp", 4, 2, false}}) {
    const std::string what = c.strategy + " world " + std::to_string(c.world) + " tp " + std::to_string(c.tp) +
                             (c.sequence_parallel ? " sp" : "");
    const int dp = c.world / c.tp;
    const TrainedRun ref = train_single(options("sgd", 2 * dp, kSgdLr), false, /*split_heads=*/true);
    const TrainedRun got = train_threads(c.strategy, c.world, options("sgd", 2, kSgdLr),
                                         {.tp = c.tp, .sequence_parallel = c.sequence_parallel});
    ASSERT_EQ(got.grad_norms.size(), 10u) << what;
    for (size_t step = 0; step < got.grad_norms.size(); ++step) {
      EXPECT_NEAR(got.grad_norms[step], ref.grad_norms[step], 1e-5 * ref.grad_norms[step]) << what << " step " << step + 1;
    }
    EXPECT_LE(max_diff(got, ref), 1e-5) << what;
    // What the planner's memory models read of a rank's part (ModelConfig::size).
    const auto split = make_llama(false, /*split_heads=*/true);
    EXPECT_EQ(recipes::llama_model(split->model()->options())->size(c.tp).params, got.largest_part) << what;
  }
  const auto o = recipes::llama_preset("llama-nano");  // 3 query heads over 1 kv head
  EXPECT_EQ(recipes::tensor_parallel_problem(o, 2, false),
            "tensor-parallel size 2 does not divide the 3 query heads and 1 kv heads (each rank holds whole kv heads "
            "with their query groups)");
}

void expect_same_steps(const TrainedRun& got, const TrainedRun& ref, const std::string& what) {
  ASSERT_EQ(got.grad_norms.size(), 10u) << what;
  for (size_t step = 0; step < got.grad_norms.size(); ++step) {
    EXPECT_NEAR(got.grad_norms[step], ref.grad_norms[step], 1e-5 * ref.grad_norms[step]) << what << " step " << step + 1;
  }
  EXPECT_LE(max_diff(got, ref), 1e-5) << what;
}

TEST(LlamaParityTest, LoraOnEveryProjectionMatchesSingleUnderFsdpAndTensorParallelism) {
  // Adapters of rank 4 on q, k, v, o, gate, up and down, the base frozen:
  // fsdp x2 with every block checkpointed (frozen and trainable flat
  // parameters per unit), and tp 2 with sequence parallelism (column
  // adapters' B and row adapters' A split, their A and B gradients summed).
  const TrainedRun ref = train_single(options("sgd", 4, kSgdLr), false, false, /*lora_rank=*/4);
  ASSERT_GT(ref.grad_norms.front(), 0.0);
  expect_same_steps(train_threads("fsdp", 2, options("sgd", 2, kSgdLr), {.checkpoint = true, .lora_rank = 4}), ref,
                    "fsdp x2 + ac, lora");
  const TrainedRun split_ref = train_single(options("sgd", 2, kSgdLr), false, /*split_heads=*/true, 4);
  const TrainedRun tp = train_threads("single", 2, options("sgd", 2, kSgdLr),
                                      {.tp = 2, .sequence_parallel = true, .lora_rank = 4});
  expect_same_steps(tp, split_ref, "tp 2 + sp, lora");
  const auto split = make_llama(false, /*split_heads=*/true, 4);
  EXPECT_EQ(recipes::llama_model(split->model()->options())->size(2).params, tp.largest_part);
}

TEST(LlamaParityTest, FsdpUnderBf16MixedMatchesSingleBf16Mixed) {
  // autocast rounds the products' inputs to bf16 in both runs; the sums of
  // two ranks' gradients differ in rounding only (the GPT's tolerance,
  // fsdp/mixed_precision_test.cpp).
  auto bf16 = [](int64_t batch) { return options("sgd", batch, kSgdLr).precision(Precision::kBf16Mixed); };
  const auto init = make_llama(false);
  std::vector<torch::Tensor> start;
  for (const auto& p : init->module().parameters()) start.push_back(p.detach().clone());
  const TrainedRun ref = train_single(bf16(4));
  const TrainedRun got = train_threads("fsdp", 2, bf16(2));
  double moved = 0, off = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    moved += (ref.params[i] - start[i]).pow(2).sum().item<double>();
    off += (got.params[i] - ref.params[i]).pow(2).sum().item<double>();
  }
  ASSERT_GT(moved, 0.0);
  std::cout << "[ llama bf16 ] fsdp x2 vs single, bf16-mixed: max |param diff| " << max_diff(got, ref)
            << ", relative update error " << std::sqrt(off / moved) << "\n";
  EXPECT_LE(max_diff(got, ref), 5e-3);
  EXPECT_LE(std::sqrt(off / moved), 0.1) << "relative update error";
}

TEST(LlamaParityTest, OneStepOfTheWrongSizeIsFarOutsideTheTolerance) {
  // The control: single-process runs whose learning rates differ by 1.5x
  // (what a gradient scaled by 1.5 does under SGD) end far apart.
  const TrainedRun a = train_single(options("sgd", 4, kSgdLr));
  const TrainedRun b = train_single(options("sgd", 4, 1.5 * kSgdLr));
  EXPECT_GT(max_diff(a, b), 1e-3);
}

}  // namespace
