// lora_test - LoRA fine-tuning under every strategy (recipes/models/lora.h): frozen
// base weights get no gradient, no optimizer state and no communication;
// every strategy matches one process; model state and bytes sent follow the
// README's formulas with the trainable count; export merges the adapters.
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/thread_world.h"
#include "tests/run_binary.h"
#include "tests/temp_dir.h"
#include "tests/toy_data.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cctype>
#include <iostream>
#include <mutex>

namespace {
using strata::recipes::GPTModule;
using strata::recipes::GPTOptions;

GPTOptions lora_options(int64_t rank = 4) {
  return strata::recipes::gpt_preset("gpt-nano").vocab_size(16).block_size(8).bias(false).lora_rank(rank)
      .lora_targets("attn,mlp");
}

GPTModule make_module(const GPTOptions& options) {
  // Thread-ranks share torch's global generator: seed and draw under a lock.
  static std::mutex init_mutex;
  std::lock_guard<std::mutex> lock(init_mutex);
  torch::manual_seed(11);
  return GPTModule(options);
}

strata::TrainerOptions options(const std::string& optimizer, int64_t batch, int64_t steps) {
  return strata::TrainerOptions().max_steps(steps).batch_size(batch).optimizer(optimizer)
      .lr(optimizer == "sgd" ? 0.1 : 1e-2).min_lr(1e-3).warmup_steps(2).weight_decay(0.1)
      .gradient_clip_val(0.0).limit_val_batches(0);
}

struct Trained {
  std::map<std::string, torch::Tensor> params;
  strata::FitResult result;
};

/// Rank 0's parameters (full) and result; `world` 0 is one process.
Trained train(const std::string& strategy, int world, const strata::TrainerOptions& opts, const GPTOptions& model) {
  Trained out;
  std::mutex mu;
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  strata::run_thread_world(std::max(world, 1), [&](strata::Comm& comm) {
    auto module = make_module(model);
    strata::testing::ToyData data;
    std::shared_ptr<strata::Strategy> s = registry.create(world == 0 ? "single" : strategy, comm);
    auto result = strata::Trainer(opts, s).fit(module, data);
    const auto full = s->full_params();  // FSDP: the module holds only shards otherwise
    std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() != 0) return;
    for (const auto& item : module.module().named_parameters()) out.params[item.key()] = item.value().detach().clone();
    out.result = result;
  }, std::chrono::seconds(60));
  return out;
}

TEST(LoraTest, EveryStrategyMatchesOneProcessAndTrainsOnlyTheAdapters) {
  auto initial_module = make_module(lora_options());
  std::map<std::string, torch::Tensor> initial;
  for (const auto& item : initial_module.module().named_parameters()) initial[item.key()] = item.value().clone();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    const auto single = train("single", 0, options(optimizer, 4, 6), lora_options());
    for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
      const auto what = strategy + " x2 " + optimizer;
      const auto got = train(strategy, 2, options(optimizer, 2, 6), lora_options());
      ASSERT_EQ(got.params.size(), single.params.size()) << what;
      int adapters = 0;
      for (const auto& [name, value] : single.params) {
        EXPECT_LE((value - got.params.at(name)).abs().max().item<double>(), 1e-5) << what << " " << name;
        if (strata::recipes::is_lora_parameter(name)) {
          ++adapters;
          if (name.back() == 'B') {
            EXPECT_GT(got.params.at(name).abs().max().item<double>(), 0.0) << what << " " << name << " did not train";
          }
        } else {
          // Frozen: bit for bit what it started as (no step, no weight decay).
          EXPECT_TRUE(torch::equal(got.params.at(name), initial.at(name))) << what << " moved frozen " << name;
        }
      }
      EXPECT_EQ(adapters, 3 * 4 * 2) << what;  // 3 blocks x 4 Linears x (A, B)
    }
  }
}

TEST(LoraTest, ModelStateAndBytesSentFollowTheFormulas) {
  // Per rank, t trainable and f frozen parameters, N ranks, AdamW (fp32):
  //   ddp: params 4(t+f), grads 4t, optimizer 8t; all-reduce 2·4t·(N-1)/N bytes sent
  //   oss: params 4(t+f), grads 4t, optimizer 8t/N; reduce-scatter + all-gather, 4t·(N-1)/N each
  //   sdp: params 4(t+f), grads 4t/N, optimizer 8t/N; reduce to owners + all-gather, 4t·(N-1)/N each
  //   fsdp: params 4f/N + 4t/N (frozen sharded too), grads 4t/N, optimizer 8t/N; reduce-scatter
  //         4t·(N-1)/N; all-gather twice (forward, backward) of the blocks' t and f, once of
  //         the last block's n_last (kept for backward) and of the root's frozen f_root
  //         (gathered for the whole step): 4(2t + 2f - f_root - n_last)(N-1)/N
  // (flat buffers pad each to a multiple of N: a few elements).
  const int world = 2;
  const auto model = lora_options();
  const int64_t t = strata::recipes::count_trainable_parameters(model);
  const int64_t f = strata::recipes::count_parameters(model) - t;
  ASSERT_EQ(t, strata::recipes::count_lora_parameters(model));
  const double share = 4.0 * static_cast<double>(t) * (world - 1) / world;
  int64_t f_root = 0;  // frozen parameters in no block: embeddings, ln_f
  int64_t n_last = 0;  // every parameter of the last block
  const std::string last_block = c10::str("h", model.n_layer() - 1, ".");
  for (const auto& item : make_module(model).module().named_parameters()) {
    if (item.key().rfind(last_block, 0) == 0) n_last += item.value().numel();
    if (item.value().requires_grad()) continue;
    if (item.key().rfind("h", 0) != 0 || item.key().find('.') == std::string::npos ||
        !std::isdigit(static_cast<unsigned char>(item.key()[1]))) {
      f_root += item.value().numel();
    }
  }
  ASSERT_GT(f_root, 0);
  ASSERT_GT(n_last, 0);
  using K = strata::CollectiveKind;
  for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
    const auto got = train(strategy, world, options("adamw", 2, 3), model);
    const auto& state = got.result.model_state_bytes[0];
    const auto& bytes = got.result.per_rank[0].comm_bytes_per_step;
    auto sent = [&](K kind) { return bytes[static_cast<int>(kind)]; };
    const bool sharded_grads = strategy == "sdp" || strategy == "fsdp";
    const int64_t pad = 4 * 64;  // padding: at most N-1 elements per flat buffer, a few buffers
    std::cout << "[ lora ] " << strategy << " x2: t " << t << ", f " << f << " | params " << state.params
              << " B, grads " << state.grads << " B, optimizer " << state.optimizer << " B | sent per step: "
              << "all-reduce " << sent(K::kAllReduce) << ", all-gather " << sent(K::kAllGather)
              << ", reduce-scatter " << sent(K::kReduceScatter) << ", reduce " << sent(K::kReduce)
              << ", broadcast " << sent(K::kBroadcast)
              << " B (4t(N-1)/N = " << share << ")" << std::endl;
    const int64_t params = strategy == "fsdp" ? 4 * f / world + 4 * t / world : 4 * (f + t);
    EXPECT_NEAR(state.params, params, pad) << strategy;
    EXPECT_NEAR(state.grads, sharded_grads ? 4 * t / world : 4 * t, pad) << strategy;
    EXPECT_NEAR(state.optimizer, strategy == "ddp" ? 8 * t : 8 * t / world, 2 * pad) << strategy;
    if (strategy == "ddp") {
      EXPECT_NEAR(sent(K::kAllReduce) - 16.0, 2 * share, 0.01 * share) << strategy;  // + the loss's all-reduce
    } else {
      // sdp reduces each bucket to its owner during backward (reduce), oss and
      // fsdp reduce-scatter; fsdp gathers each unit for forward and backward
      // but the last, kept from its forward to its backward.
      const double gathered =
          strategy == "fsdp" ? 4.0 * (2 * t + 2 * f - f_root - n_last) * (world - 1) / world : share;
      EXPECT_NEAR(sent(strategy == "sdp" ? K::kReduce : K::kReduceScatter), share, 0.02 * share) << strategy;
      EXPECT_NEAR(sent(K::kAllGather), gathered, 0.02 * share) << strategy;
    }
  }
}

TEST(LoraTest, MergedWeightsComputeTheAdaptedModel) {
  auto lora = make_module(lora_options());
  {
    torch::NoGradGuard no_grad;  // adapters as after training: B no longer zero
    for (auto& item : lora.module().named_parameters()) {
      if (item.key().size() > 2 && item.key().substr(item.key().size() - 2) == ".B") item.value().normal_(0.0, 0.05);
    }
  }
  auto plain = make_module(lora_options(0));
  const auto merged = strata::recipes::merge_lora(strata::recipes::named_parameters_of(lora.module()),
                                                  lora_options().lora_rank(), lora_options().lora_alpha());
  {
    torch::NoGradGuard no_grad;
    for (auto& item : plain.module().named_parameters()) item.value().copy_(merged.at(item.key()));
  }
  lora.module().eval();
  plain.module().eval();
  const auto idx = torch::randint(16, {2, 8});
  const auto want = lora.model()->forward(idx), got = plain.model()->forward(idx);
  EXPECT_LE((want - got).abs().max().item<double>(), 1e-5);
  // The control: without merging, the adapters' contribution is missing.
  auto base = make_module(lora_options(0));
  base.module().eval();
  EXPECT_GT((want - base.model()->forward(idx)).abs().max().item<double>(), 1e-3);
}

TEST(LoraTest, StrataGptUnderFsdpMatchesOneProcessAndExportsAPlainGpt) {
  strata::testing::TempDir dir("strata-lora");
  auto run = [&](const std::string& tag, const std::string& flags, int steps = 8) {
    const std::string args = "--preset gpt-nano --data addition:2 --max-steps " + std::to_string(steps) +
                             " --warmup-steps 1 --bias false "
                             "--optimizer sgd --lr 0.1 --min-lr 0.01 --gradient-clip-val 0 --threads-per-rank 1 "
                             "--limit-val-batches 1 --log-every-n-steps 100 --progress-bar false --output-dir " +
                             dir.file(tag) + " " + flags;
    return strata::testing::run_gpt_binary(args);
  };
  const std::string lora = " --lora-rank 4 --lora-targets attn,mlp --lora-alpha 16";
  auto single = run("single", "--batch-size 8" + lora + " --dump-params " + dir.file("single.pt") +
                                  " --export-weights " + dir.file("merged.pt"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  auto fsdp = run("fsdp", "--strategy fsdp --nproc 2 --batch-size 4" + lora + " --dump-params " + dir.file("fsdp.pt"));
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  const auto a = strata::testing::load_archive(dir.file("single.pt"));
  const auto b = strata::testing::load_archive(dir.file("fsdp.pt"));
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, value] : a) EXPECT_LE((value - b.at(name)).abs().max().item<double>(), 1e-5) << name;
  // The export holds W + (alpha / rank) B A with this run's alpha (16 / 4).
  const auto merged = strata::recipes::read_weights(dir.file("merged.pt"));
  for (const std::string stem : {"h0.attn.c_attn", "h2.c_proj"}) {
    const auto want = a.at(stem + ".weight") + 4.0 * torch::matmul(a.at(stem + "_lora.B"), a.at(stem + "_lora.A"));
    const auto got = merged.at(strata::recipes::to_nanogpt_name(stem + ".weight"));
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-6) << stem;
    EXPECT_GT((a.at(stem + "_lora.B")).abs().max().item<double>(), 0.0) << stem << ": the adapter did not train";
  }
  // The merged export is a plain GPT: it starts a run without LoRA, and a
  // LoRA run (fresh adapters on top of it).
  for (const std::string& flags : {std::string(""), lora}) {
    auto next = run("next" + std::to_string(flags.size()), "--batch-size 4 --init-from " + dir.file("merged.pt") + flags,
                    /*steps=*/1);
    EXPECT_EQ(next.exit_code, 0) << flags << "\n" << next.output;
  }
}

}  // namespace
