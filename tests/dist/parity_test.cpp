// parity_test - every strategy against single-process training, multi-process
// through the real launcher (strata-gpt --nproc N), on gpt-nano.
//
// N ranks with --batch-size B see exactly the samples one process with
// --batch-size N*B sees (DataSource contract), so after 10 steps the
// parameters must agree within 1e-5 (fp32) for every strategy.
#include "tests/dist/run_binary.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

fs::path scratch() {
  static const fs::path dir = fs::temp_directory_path() / ("strata-parity-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::map<std::string, torch::Tensor> load_params(const fs::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  std::map<std::string, torch::Tensor> out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    archive.read(key, t);
    out[key] = t;
  }
  return out;
}

struct Run {
  std::string strategy;
  int nproc;
  int64_t batch;
  int64_t accum;
  double clip;
  std::string precision;
};

fs::path train(const Run& r) {
  const std::string tag = r.strategy + "-n" + std::to_string(r.nproc) + "-b" + std::to_string(r.batch) +
                          "-a" + std::to_string(r.accum) + "-c" + std::to_string(r.clip) + "-" + r.precision;
  const fs::path out = scratch() / tag;
  const fs::path dump = scratch() / (tag + ".pt");
  if (fs::exists(dump)) return dump;  // references are shared between tests
  std::ostringstream args;
  // Why no Linear biases and lr 1e-4: Adam divides each gradient element by
  // its own RMS, so an element whose gradient is a near-cancelling sum (the
  // attention key bias's is analytically zero) turns fp32 summation-order
  // noise into steps of up to ~lr. Measured here at world size 3: max |diff|
  // 2.5e-5 at lr 1e-3, 7.5e-6 at 3e-4 (ddp, oss and sdp alike, so it is not a
  // sharding effect). At 1e-4 that noise is ~2.5e-6, while any real bug
  // (wrong batch, stale shard) moves parameters by ~lr per step, i.e. ~1e-3
  // after 10 steps: DifferentGlobalBatchIsDetected shows the margin.
  args << "--preset gpt-nano --data addition:2 --max-steps 10 --warmup-steps 2 --lr 1e-4 --min-lr 1e-5 --bias false"
       << " --strategy " << r.strategy << " --nproc " << r.nproc << " --batch-size " << r.batch
       << " --accumulate-grad-batches " << r.accum << " --gradient-clip-val " << r.clip
       << " --precision " << r.precision << " --threads-per-rank 1 --limit-val-batches 1"
       << " --progress-bar false --output-dir " << out.string() << " --dump-params " << dump.string()
       << " --comm-timeout 60";
  auto run = run_gpt_binary(args.str());
  EXPECT_EQ(run.exit_code, 0) << args.str() << "\n" << run.output;
  return dump;
}

void expect_parity(const Run& ranks, double tolerance) {
  Run single = ranks;
  single.strategy = "single";
  single.nproc = 1;
  single.batch = ranks.batch * ranks.nproc;
  const auto reference = load_params(train(single));
  const auto got = load_params(train(ranks));
  ASSERT_FALSE(reference.empty());
  ASSERT_EQ(reference.size(), got.size());
  for (const auto& [name, value] : reference) {
    const double diff = (value - got.at(name)).abs().max().item<double>();
    EXPECT_LE(diff, tolerance) << "strategy=" << ranks.strategy << " nproc=" << ranks.nproc
                               << " accum=" << ranks.accum << " clip=" << ranks.clip
                               << " precision=" << ranks.precision << " param " << name;
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
  const auto reference = load_params(train({"single", 1, 6, 1, 0.0, "32"}));
  const auto other = load_params(train({"ddp", 2, 2, 1, 0.0, "32"}));
  double worst = 0.0;
  for (const auto& [name, value] : reference) worst = std::max(worst, (value - other.at(name)).abs().max().item<double>());
  EXPECT_GT(worst, 1e-4);
}

TEST(DdpParityTest, MatchesSingleProcessUnderBf16Mixed) {
  // bf16 matmuls round differently when the batch is split, so the tolerance
  // is that of bf16 arithmetic, not fp32's.
  expect_parity({"ddp", 2, 2, 1, 0.0, "bf16-mixed"}, 5e-3);
}

TEST(OssParityTest, MatchesSingleProcessAfterTenSteps) {
  for (int n : {2, 3, 4}) {
    expect_parity({"oss", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"zero1", n, 2, 2, 0.05, "32"}, 1e-5);
  }
}

TEST(ShardedParityTest, MatchesSingleProcessUnderBf16Mixed) {
  expect_parity({"oss", 2, 2, 1, 0.0, "bf16-mixed"}, 5e-3);
  expect_parity({"sdp", 2, 2, 1, 0.0, "bf16-mixed"}, 5e-3);
}

TEST(SdpParityTest, MatchesSingleProcessAfterTenSteps) {
  for (int n : {2, 3, 4}) {
    expect_parity({"sdp", n, 2, 1, 0.0, "32"}, 1e-5);
    expect_parity({"zero2", n, 2, 2, 0.05, "32"}, 1e-5);
  }
}

TEST(ShardedMemoryTest, PeakTensorBytesFallWithWorldSize) {
  // gpt-mini on short sequences: model state dominates, so the per-rank peak
  // must shrink as N grows. A 1 MiB bucket cap keeps the reduce-scatter /
  // all-gather round buffers (2 x cap) small next to the model, as the default
  // 25 MiB cap is next to a large model; at 25 MiB they would hold this 11 MB
  // model's gradients twice over at every N and hide the trend.
  std::map<std::string, std::vector<int64_t>> peak;
  for (const std::string strategy : {"oss", "sdp"}) {
    for (int n : {1, 2, 4}) {
      const fs::path out = scratch() / ("mem-" + strategy + std::to_string(n));
      auto run = run_gpt_binary("--preset gpt-mini --data addition --max-steps 3 --batch-size 4 --strategy " +
                                strategy + " --nproc " + std::to_string(n) +
                                " --threads-per-rank 1 --limit-val-batches 0 --progress-bar false --bucket-cap-mb 1 --output-dir " +
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
}  // namespace
