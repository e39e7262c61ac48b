// parity_test - every strategy against single-process training, multi-process
// through the real launcher (strata-gpt --nproc N), on gpt-nano.
//
// N ranks with --batch-size B see exactly the samples one process with
// --batch-size N*B sees (DataSource contract), so after 10 steps the
// parameters must agree within 1e-5 (fp32) for every strategy.
//
// Two optimizers: AdamW (the recipe's), and plain SGD for the gradient's
// scale. Adam divides each update by the element's own RMS, so a gradient N
// times too large or too small (a missing or doubled division by the world
// size) changes its update by ~eps and would pass; SGD's update is lr times
// the gradient, and the logged grad_norm is the gradient's global norm itself.
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "strata/core/net.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;
using strata::testing::load_archive;

fs::path scratch() {
  static const fs::path dir = fs::temp_directory_path() / ("strata-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::map<std::string, torch::Tensor> load_params(const fs::path& path) { return load_archive(path); }

struct TrainRun {
  std::string strategy;
  int nproc;
  int64_t batch;
  int64_t accum;
  double clip;
  std::string precision;
  std::string optimizer = "adamw";
  double lr_scale = 1.0;  ///< multiplies the lr (and min-lr): for the control test only
  int64_t activation_checkpointing = 0;  ///< --activation-checkpointing
  double dropout = 0.0;
  std::string extra = "";  ///< more flags (e.g. fsdp's), part of the run's identity
};

// SGD's learning rate for the gradient-scale runs: large enough that a 2x
// gradient moves parameters far more than the tolerance
// (SgdParityTest.TwiceTheUpdateIsDetected), small enough to stay out of
// chaos. Measured at 2-4 ranks, accumulation 1 and 2: worst differences to one
// process 1.2e-7 (params) and 8e-7 relative (grad_norm) at lr 0.1; at lr 0.5
// training turned chaotic and fp32 rounding grew to 1.7e-3 (params) and 4.5e-3
// relative (grad_norm) by step 10 at 4 ranks with accumulation.
constexpr double kSgdLr = 0.1;

/// What a finished run left: the final parameters and metrics.csv.
struct Trained {
  fs::path params;
  fs::path metrics;
};

Trained train(const TrainRun& r) {
  const std::string tag = r.strategy + "-n" + std::to_string(r.nproc) + "-b" + std::to_string(r.batch) +
                          "-a" + std::to_string(r.accum) + "-c" + std::to_string(r.clip) + "-" + r.precision +
                          "-" + r.optimizer + "-x" + std::to_string(r.lr_scale) + "-ac" +
                          std::to_string(r.activation_checkpointing) + "-d" + std::to_string(r.dropout) +
                          (r.extra.empty() ? "" : "-" + std::to_string(std::hash<std::string>{}(r.extra)));
  const fs::path out = scratch() / tag;
  const fs::path dump = scratch() / (tag + ".pt");
  const Trained trained{dump, out / "metrics.csv"};
  if (fs::exists(dump)) return trained;  // references are shared between tests
  const bool sgd = r.optimizer == "sgd";
  const double lr = (sgd ? kSgdLr : 1e-4) * r.lr_scale;
  std::ostringstream args;
  // Why no Linear biases and (AdamW) lr 1e-4: Adam divides each gradient element by
  // its own RMS, so an element whose gradient is a near-cancelling sum (the
  // attention key bias's is analytically zero) turns fp32 summation-order
  // noise into steps of up to ~lr. Measured here at world size 3: max |diff|
  // 2.5e-5 at lr 1e-3, 7.5e-6 at 3e-4 (ddp, oss and sdp alike, so it is not a
  // sharding effect). At 1e-4 that noise is ~2.5e-6, while any real bug
  // (wrong batch, stale shard) moves parameters by ~lr per step, i.e. ~1e-3
  // after 10 steps: DifferentGlobalBatchIsDetected shows the margin.
  // SGD: every step logged, for the grad_norm comparison.
  args << "--preset gpt-nano --data addition:2 --max-steps 10 --warmup-steps 2 --bias false"
       << " --optimizer " << r.optimizer << " --lr " << lr << " --min-lr " << lr / 10
       << " --log-every-n-steps " << (sgd ? 1 : 100) << " --strategy " << r.strategy
       << " --nproc " << r.nproc << " --batch-size " << r.batch
       << " --accumulate-grad-batches " << r.accum << " --gradient-clip-val " << r.clip
       << " --precision " << r.precision << " --threads-per-rank 1 --limit-val-batches 1"
       << " --progress-bar false --output-dir " << out.string() << " --dump-params " << dump.string()
       << " --comm-timeout 60 --activation-checkpointing " << r.activation_checkpointing
       << " --dropout " << r.dropout << " " << r.extra;
  auto run = run_gpt_binary(args.str());
  EXPECT_EQ(run.exit_code, 0) << args.str() << "\n" << run.output;
  return trained;
}

std::string label(const TrainRun& r) {
  std::ostringstream out;
  out << "strategy=" << r.strategy << " nproc=" << r.nproc << " accum=" << r.accum << " clip=" << r.clip
      << " precision=" << r.precision << " optimizer=" << r.optimizer << " " << r.extra;
  return out.str();
}

/// The same run on one process with the same global batch.
TrainRun single_reference(const TrainRun& ranks) {
  TrainRun single = ranks;
  single.strategy = "single";
  single.nproc = 1;
  single.batch = ranks.batch * ranks.nproc;
  single.extra = "";  // strategy-specific flags: single takes none
  return single;
}

void expect_parity(const TrainRun& ranks, double tolerance) {
  const auto reference = load_params(train(single_reference(ranks)).params);
  const auto got = load_params(train(ranks).params);
  ASSERT_FALSE(reference.empty());
  ASSERT_EQ(reference.size(), got.size());
  for (const auto& [name, value] : reference) {
    const double diff = (value - got.at(name)).abs().max().item<double>();
    EXPECT_LE(diff, tolerance) << label(ranks) << " param " << name;
  }
}

/// bf16-mixed: bf16 matmuls round differently when the batch is split, so
/// single elements may differ by bf16 noise (max |diff| <= 5e-3), and at this
/// lr ten steps move no element by more than ~1e-3: the element check alone
/// would pass a run that never steps. So the runs' updates are compared too,
/// each from the shared initial parameters, in L2 over the whole model: a run
/// that skips its step is 100% off, one with twice the update 100%, a correct
/// bf16-mixed run 0.3-1.8% (measured here: ddp/oss/sdp 0.35%, fsdp 1.1%; the
/// in-process fsdp tests 0.5% and 1.8%).
/// The initial parameters: the same run at lr 1e-30, AdamW steps far below
/// fp32's resolution of the weights.
constexpr double kBf16UpdateTolerance = 0.1;

void expect_bf16_parity(const TrainRun& ranks) {
  ASSERT_EQ(ranks.precision, "bf16-mixed");
  const auto reference = load_params(train(single_reference(ranks)).params);
  const auto got = load_params(train(ranks).params);
  TrainRun frozen = single_reference(ranks);
  frozen.lr_scale = 1e-26;
  const auto initial = load_params(train(frozen).params);
  ASSERT_FALSE(reference.empty());
  ASSERT_EQ(reference.size(), got.size());
  double error2 = 0.0, update2 = 0.0;
  for (const auto& [name, value] : reference) {
    EXPECT_LE((value - got.at(name)).abs().max().item<double>(), 5e-3) << label(ranks) << " param " << name;
    const auto update = value - initial.at(name);
    error2 += (got.at(name) - initial.at(name) - update).pow(2).sum().item<double>();
    update2 += update.pow(2).sum().item<double>();
  }
  ASSERT_GT(update2, 0.0) << "the reference run did not train";
  const double relative = std::sqrt(error2 / update2);
  EXPECT_LE(relative, kBf16UpdateTolerance) << label(ranks) << ": |update - single's| / |single's update|";
  std::cout << "[ bf16 parity ] " << label(ranks) << ": relative update error " << relative << std::endl;
}

/// grad_norm of every training row of metrics.csv, in step order.
std::vector<double> logged_grad_norms(const fs::path& metrics) {
  std::vector<double> norms;
  for (const auto& cell : strata::testing::metrics_column(metrics, "grad_norm")) {
    if (!cell.empty()) norms.push_back(std::stod(cell));
  }
  return norms;
}

/// The scale checks, SGD without clipping: final parameters within 1e-5 of one
/// process with the same global batch, and every step's logged global gradient
/// norm within 1e-5 relative of its.
void expect_gradient_scale_parity(const TrainRun& ranks) {
  ASSERT_EQ(ranks.optimizer, "sgd");
  ASSERT_EQ(ranks.clip, 0.0) << "clipping would rescale a wrong-sized gradient";
  expect_parity(ranks, 1e-5);
  const auto reference = logged_grad_norms(train(single_reference(ranks)).metrics);
  const auto got = logged_grad_norms(train(ranks).metrics);
  ASSERT_EQ(reference.size(), 10u) << label(ranks) << ": one grad_norm per step in metrics.csv";
  ASSERT_EQ(got.size(), reference.size()) << label(ranks);
  for (size_t step = 0; step < got.size(); ++step) {
    EXPECT_NEAR(got[step], reference[step], 1e-5 * reference[step])
        << label(ranks) << " step " << step + 1 << " (ratio " << got[step] / reference[step] << ")";
  }
}

/// ddp, oss, sdp and fsdp at `nproc` ranks, without and with accumulation;
/// the two single-process references are shared by the four strategies.
void expect_gradient_scale_parity_at(int nproc) {
  for (int64_t accum : {1, 2}) {
    for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
      expect_gradient_scale_parity({strategy, nproc, 2, accum, 0.0, "32", "sgd"});
    }
  }
}

TEST(SgdParityTest, GradientScaleMatchesSingleProcessAtTwoRanks) { expect_gradient_scale_parity_at(2); }
TEST(SgdParityTest, GradientScaleMatchesSingleProcessAtThreeRanks) { expect_gradient_scale_parity_at(3); }
TEST(SgdParityTest, GradientScaleMatchesSingleProcessAtFourRanks) { expect_gradient_scale_parity_at(4); }

TEST(SgdParityTest, TwiceTheUpdateIsDetected) {
  // Control for the tolerance: doubling SGD's lr doubles each update as a 2x
  // gradient would (weight decay aside), and moves parameters far beyond 1e-5.
  const TrainRun base{"single", 1, 4, 1, 0.0, "32", "sgd"};
  TrainRun doubled = base;
  doubled.lr_scale = 2.0;
  const auto reference = load_params(train(base).params);
  const auto other = load_params(train(doubled).params);
  double worst = 0.0;
  for (const auto& [name, value] : reference) worst = std::max(worst, (value - other.at(name)).abs().max().item<double>());
  EXPECT_GT(worst, 1e-3);
}

TEST(ActivationCheckpointingTest, SameTrainingThroughTheBinary) {
  // --activation-checkpointing recomputes blocks in backward: the same
  // parameters as without it, under one process and under ddp (whose gradient
  // hooks must still fire), every block and every 2nd block, with dropout
  // (one process: the recompute must replay the dropout masks).
  for (const TrainRun& run : {TrainRun{"single", 1, 4, 1, 0.0, "32", "sgd"},
                              TrainRun{"ddp", 2, 2, 1, 0.0, "32", "sgd"}}) {
    for (int64_t every : {1, 2}) {
      for (double dropout : {0.0, 0.1}) {
        if (run.nproc > 1 && dropout > 0) continue;  // ranks draw different masks than one process
        TrainRun plain = run;
        plain.dropout = dropout;
        TrainRun checkpointed = plain;
        checkpointed.activation_checkpointing = every;
        const auto reference = load_params(train(plain).params);
        const auto got = load_params(train(checkpointed).params);
        ASSERT_EQ(reference.size(), got.size());
        for (const auto& [name, value] : reference) {
          EXPECT_LE((value - got.at(name)).abs().max().item<double>(), 1e-6)
              << label(checkpointed) << " every=" << every << " dropout=" << dropout << " param " << name;
        }
      }
    }
  }
}

TEST(OffloadParityTest, OptimizerStateOffloadChangesNothingUnderEveryStrategy) {
  // --offload disk with single, ddp, oss and sdp keeps the optimizer state in
  // an unnamed file and streams it through the step: the same parameters as
  // without it, nothing of it resident, and nothing left in the directory.
  const fs::path offload_dir = scratch() / "offload-dir";
  fs::create_directories(offload_dir);
  const std::string offload = "--offload disk --offload-dir " + offload_dir.string();
  for (const TrainRun& run : {TrainRun{"single", 1, 4, 1, 0.0, "32"}, TrainRun{"ddp", 2, 2, 2, 0.05, "32"},
                              TrainRun{"oss", 3, 2, 1, 0.0, "32"}, TrainRun{"sdp", 3, 2, 2, 0.05, "32"},
                              TrainRun{"ddp", 2, 2, 1, 0.0, "32", "sgd"}}) {
    TrainRun offloaded = run;
    offloaded.extra = offload;
    const auto reference = load_params(train(run).params);
    const auto trained = train(offloaded);
    const auto got = load_params(trained.params);
    ASSERT_EQ(reference.size(), got.size()) << label(offloaded);
    for (const auto& [name, value] : reference) {
      // The same kernel on the same values, in chunks: equal up to how the
      // vectorised kernel treats a chunk's first and last elements.
      EXPECT_LE((value - got.at(name)).abs().max().item<double>(), 1e-6) << label(offloaded) << " param " << name;
    }
    std::ifstream in(trained.metrics.parent_path() / "summary.json");
    const auto summary = nlohmann::json::parse(in);
    int64_t psi = 0;
    for (const auto& [name, value] : reference) psi += value.numel();
    // AdamW's two fp32 moments of what this rank steps: all of the model
    // (single, ddp) or its 1/N shard (oss, sdp; the last rank's may be short
    // by the padding); SGD has none.
    const bool sharded = run.strategy == "oss" || run.strategy == "sdp";
    const int64_t expected = run.optimizer == "sgd" ? 0 : 8 * (sharded ? (psi + run.nproc - 1) / run.nproc : psi);
    ASSERT_TRUE(summary.contains("offload_bytes")) << label(offloaded) << summary.dump();
    EXPECT_NEAR(summary["offload_bytes"].get<double>(), static_cast<double>(expected), 8.0 * run.nproc)
        << label(offloaded);
    for (const auto& rank : summary["model_state_bytes"]) {
      EXPECT_EQ(rank["optimizer"].get<int64_t>(), 0) << label(offloaded) << ": no optimizer state resident";
    }
    EXPECT_TRUE(fs::is_empty(offload_dir)) << "the offload file is unnamed and gone with the run";
  }
}

TEST(DdpParityTest, MatchesSingleProcessAfterTenSteps) {
  for (int n : {2, 4}) {
    expect_parity({"ddp", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"ddp", n, 2, 2, 0.05, "32"}, 1e-5);  // accumulation + clipping
  }
}

TEST(DdpParityTest, DifferentGlobalBatchIsDetected) {
  // The tolerance is discriminating: 2 ranks x 2 samples are a different
  // global batch than 1 x 6, and the parameters must then differ clearly.
  const auto reference = load_params(train({"single", 1, 6, 1, 0.0, "32"}).params);
  const auto other = load_params(train({"ddp", 2, 2, 1, 0.0, "32"}).params);
  double worst = 0.0;
  for (const auto& [name, value] : reference) worst = std::max(worst, (value - other.at(name)).abs().max().item<double>());
  EXPECT_GT(worst, 1e-4);
}

TEST(DdpParityTest, MatchesSingleProcessUnderBf16Mixed) {
  // bf16 matmuls round differently when the batch is split, so the tolerance
  // is that of bf16 arithmetic, not fp32's.
  expect_bf16_parity({"ddp", 2, 2, 1, 0.0, "bf16-mixed"});
}

TEST(OssParityTest, MatchesSingleProcessAfterTenSteps) {
  for (int n : {2, 3, 4}) {
    expect_parity({"oss", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"zero1", n, 2, 2, 0.05, "32"}, 1e-5);
  }
}

TEST(ShardedParityTest, MatchesSingleProcessUnderBf16Mixed) {
  expect_bf16_parity({"oss", 2, 2, 1, 0.0, "bf16-mixed"});
  expect_bf16_parity({"sdp", 2, 2, 1, 0.0, "bf16-mixed"});
}

TEST(SdpParityTest, MatchesSingleProcessAfterTenSteps) {
  for (int n : {2, 3, 4}) {
    expect_parity({"sdp", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"zero2", n, 2, 2, 0.05, "32"}, 1e-5);
  }
}

TEST(FsdpParityTest, MatchesSingleProcessAfterTenSteps) {
  // gpt-nano's lm_head is tied to the token embedding: the root unit holds it.
  for (int n : {2, 3, 4}) {
    expect_parity({"fsdp", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"zero3", n, 2, 2, 0.05, "32"}, 1e-5);  // accumulation + clipping
  }
  for (const std::string extra : {"--sharding-strategy shard_grad_op", "--sharding-strategy no_shard",
                                  "--reshard-after-forward false", "--limit-all-gathers false",
                                  "--wrap-policy none"}) {
    TrainRun run{"fsdp", 3, 2, 2, 0.05, "32"};
    run.extra = extra;
    expect_parity(run, 1e-5);
  }
}

TEST(FsdpParityTest, MatchesSingleProcessUnderBf16Mixed) {
  expect_bf16_parity({"fsdp", 2, 2, 1, 0.0, "bf16-mixed"});
}

TEST(ShardedMemoryTest, PeakTensorBytesFallWithWorldSize) {
  // gpt-mini on short sequences: model state dominates, so the per-rank peak
  // must shrink as N grows. A 1 MiB bucket cap keeps the reduce-scatter /
  // all-gather round buffers (2 x cap) small next to the model, as the default
  // 25 MiB cap is next to a large model; at 25 MiB they would hold this 11 MB
  // model's gradients twice over at every N and hide the trend.
  std::map<std::string, std::vector<int64_t>> peak;
  for (const std::string strategy : {"oss", "sdp", "fsdp"}) {
    for (int n : {1, 2, 4}) {
      const fs::path out = scratch() / ("mem-" + strategy + std::to_string(n));
      auto run = run_gpt_binary("--preset gpt-mini --data addition --max-steps 3 --batch-size 4 --strategy " +
                                strategy + " --nproc " + std::to_string(n) +
                                " --threads-per-rank 1 --limit-val-batches 0 --progress-bar false" +
                                (strategy == "fsdp" ? "" : " --bucket-cap-mb 1") + " --output-dir " +
                                out.string());
      ASSERT_EQ(run.exit_code, 0) << run.output;
      std::ifstream in(out / "summary.json");
      auto summary = nlohmann::json::parse(in);
      // --device auto trains where CUDA is usable, else on the CPU.
      EXPECT_EQ(summary.value("device", "<none>"), torch::cuda::is_available() ? "cuda:0" : "cpu");
      int64_t worst = 0;
      for (int64_t b : summary["peak_tensor_bytes"]) worst = std::max(worst, b);
      peak[strategy].push_back(worst);
    }
    EXPECT_LT(peak[strategy][1], peak[strategy][0]) << strategy;
    EXPECT_LT(peak[strategy][2], peak[strategy][1]) << strategy;
  }
}

// ---- FSDP hybrid_shard: two launchers (--nnodes 2) on loopback -------------

TEST(FsdpParityTest, HybridShardOverTwoLaunchedNodesMatchesSingleProcess) {
  // Two strata-gpt launchers, --nnodes 2 --nproc 2 each, meeting at rank 0's
  // store on 127.0.0.1: 4 ranks in 2 nodes of 2. hybrid_shard shards inside
  // each launcher's ranks and all-reduces the shard gradients across them.
  // Against one process with the same global batch (4 x 2), with accumulation
  // and active clipping: parameters within 1e-5 and every step's logged
  // grad_norm within 1e-5 relative (a norm summed over both nodes' copies of
  // the shards would be sqrt(2) too large).
  const std::string common =
      "--preset gpt-nano --data addition:2 --max-steps 10 --warmup-steps 2 --bias false --optimizer adamw"
      " --lr 0.0001 --min-lr 1e-05 --log-every-n-steps 1 --accumulate-grad-batches 2 --gradient-clip-val 0.05"
      " --threads-per-rank 1 --limit-val-batches 1 --progress-bar false --comm-timeout 60";
  const fs::path dir = scratch() / "hybrid-two-nodes";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto single = run_gpt_binary(common + " --strategy single --batch-size 8 --output-dir " +
                                     (dir / "single").string() + " --dump-params " + (dir / "single.pt").string());
  ASSERT_EQ(single.exit_code, 0) << single.output;

  const int port = strata::find_free_port("127.0.0.1");
  auto node_args = [&](int node) {
    return common + " --strategy fsdp --sharding-strategy hybrid_shard --batch-size 2 --nproc 2 --nnodes 2" +
           " --master-addr 127.0.0.1 --master-port " + std::to_string(port) + " --node-rank " +
           std::to_string(node) + " --output-dir " + (dir / ("node" + std::to_string(node))).string() +
           " --dump-params " + (dir / ("node" + std::to_string(node) + ".pt")).string();
  };
  // Why concurrently: each launcher's ranks block in the rendezvous until the
  // other node's ranks arrive.
  auto node1 = std::async(std::launch::async, [&] { return run_gpt_binary(node_args(1)); });
  const auto node0 = run_gpt_binary(node_args(0));
  const auto node1_run = node1.get();
  ASSERT_EQ(node0.exit_code, 0) << node_args(0) << "\n" << node0.output;
  ASSERT_EQ(node1_run.exit_code, 0) << node_args(1) << "\n" << node1_run.output;
  EXPECT_NE(node0.output.find("hybrid_shard, shard group of 2 of 4 rank(s), replicated 2x"), std::string::npos)
      << node0.output;

  const auto reference = load_params(dir / "single.pt");
  const auto got = load_params(dir / "node0.pt");
  ASSERT_FALSE(reference.empty());
  ASSERT_EQ(reference.size(), got.size());
  for (const auto& [name, value] : reference) {
    EXPECT_LE((value - got.at(name)).abs().max().item<double>(), 1e-5) << "param " << name;
  }
  const auto reference_norms = logged_grad_norms(dir / "single" / "metrics.csv");
  const auto got_norms = logged_grad_norms(dir / "node0" / "metrics.csv");
  ASSERT_EQ(reference_norms.size(), 10u);
  ASSERT_EQ(got_norms.size(), reference_norms.size());
  for (size_t step = 0; step < got_norms.size(); ++step) {
    EXPECT_NEAR(got_norms[step], reference_norms[step], 1e-5 * reference_norms[step]) << "step " << step + 1;
  }
}

TEST(FsdpParityTest, HybridShardWithANodeSizeThatDoesNotDivideTheWorldExitsTwo) {
  // Only an outside launcher can say so (strata's own runs --nproc ranks on
  // each of --nnodes nodes): LOCAL_WORLD_SIZE 3 in a world of 4.
  const fs::path out = scratch() / "hybrid-bad-node-size";
  fs::remove_all(out);
  const auto run = run_gpt_binary(
      "--preset gpt-nano --data addition:2 --max-steps 1 --strategy fsdp --sharding-strategy hybrid_shard"
      " --output-dir " + out.string(),
      "RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output,
            "error: hybrid_shard: node size (LOCAL_WORLD_SIZE) 3 does not divide WORLD_SIZE 4; every node must "
            "run the same number of consecutive ranks\n");
  EXPECT_FALSE(fs::exists(out)) << "nothing is written before the input is known to be good";
}
}  // namespace
