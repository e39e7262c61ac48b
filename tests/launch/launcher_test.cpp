// launcher_test - the strata-gpt binary end to end: failure handling across
// ranks, and the bad-input contract (one-line error naming the value, exit
// code 2, no output directory left looking valid).
#include "tests/run_binary.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

fs::path scratch() {
  static const fs::path dir = fs::temp_directory_path() / ("strata-launch-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

const std::string kQuick =
    " --preset gpt-nano --data addition:2 --batch-size 2 --threads-per-rank 1 --progress-bar false"
    " --limit-val-batches 1 ";

TEST(LauncherTest, RankFailingAtStepThreeStopsEveryoneAndIsNamed) {
  const auto out = scratch() / "fail";
  // A comm timeout far above the bound below: a peer hanging until the
  // timeout ends it would fail the bound, not pass it.
  auto run = run_gpt_binary("--strategy ddp --nproc 3 --max-steps 50 --comm-timeout 120" + kQuick +
                                "--output-dir " + out.string(),
                            "STRATA_TEST_FAIL_AT_STEP=3 STRATA_TEST_FAIL_RANK=1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(run.seconds, 20.0) << run.output;
  EXPECT_NE(run.output.find("rank 1 failed"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("injected failure at step 3"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out / "summary.json"));
}

TEST(LauncherTest, TwoRankRunWritesPerRankSummary) {
  const auto out = scratch() / "ok";
  auto run = run_gpt_binary("--strategy sdp --nproc 2 --max-steps 3" + kQuick + "--output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(out / "summary.json");
  std::stringstream text;
  text << in.rdbuf();
  for (const char* key : {"\"strategy\"", "\"world_size\": 2", "\"peak_tensor_bytes\"", "\"model_state_bytes\"",
                          "\"peak_rss_bytes\"", "\"val_accuracy\"", "\"tokens_per_s\""}) {
    EXPECT_NE(text.str().find(key), std::string::npos) << key << "\n" << text.str();
  }
  EXPECT_TRUE(fs::exists(out / "metrics.csv"));
  EXPECT_TRUE(fs::exists(out / "config.ini"));
}

TEST(LauncherTest, ProfileWritesAChromeTracePerRankWithStrataPhases) {
  const auto out = scratch() / "profiled";
  const auto traces = scratch() / "traces";
  fs::remove_all(traces);
  auto run = run_gpt_binary("--strategy fsdp --nproc 2 --max-steps 6" + kQuick + "--output-dir " + out.string() +
                            " --profile " + traces.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(traces / ("trace-rank" + std::to_string(rank) + ".json"));
    ASSERT_TRUE(in.good()) << "rank " << rank << "\n" << run.output;
    std::stringstream text;
    text << in.rdbuf();
    // Chrome's trace format, with strata's own phases among ATen's ops.
    for (const char* name : {"\"traceEvents\"", "strata::fsdp_gather", "strata::reduce_scatter",
                             "strata::optimizer_step", "aten::mm"}) {
      EXPECT_NE(text.str().find(name), std::string::npos) << name << " in rank " << rank;
    }
  }
}

TEST(LauncherTest, MfuIsWithinZeroAndOneAndNamesItsPeak) {
  const auto out = scratch() / "mfu";
  auto run = run_gpt_binary("--strategy ddp --nproc 2 --max-steps 6" + kQuick + "--output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(out / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  ASSERT_TRUE(summary["mfu"].is_number()) << summary.dump(2);
  EXPECT_GT(summary["mfu"].get<double>(), 0.0);
  EXPECT_LE(summary["mfu"].get<double>(), 1.0);
  EXPECT_GT(summary["peak_flops_per_rank"].get<double>(), 1e8);
  // The launcher measured (or found cached) the peak before the ranks ran.
  EXPECT_NE(summary["peak_flops_source"].get<std::string>().find("cached"), std::string::npos) << summary.dump(2);
  // A peak far below what the run achieves: MFU above 1, reported as unknown.
  const auto low = scratch() / "mfu-low";
  run = run_gpt_binary("--strategy single --max-steps 6 --peak-flops 1000" + kQuick + "--output-dir " + low.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in_low(low / "summary.json");
  const auto low_summary = nlohmann::json::parse(in_low);
  EXPECT_TRUE(low_summary["mfu"].is_null()) << low_summary.dump(2);
  EXPECT_EQ(low_summary["peak_flops_source"], "--peak-flops");
  EXPECT_NE(run.output.find("MFU n/a (above 1"), std::string::npos) << run.output;
}

struct BadInput {
  std::string args;
  std::string expect;  // must appear in the one-line error
};

TEST(BadInputTest, EachIsAOneLineErrorWithExitCodeTwo) {
  const auto dir = scratch() / "bad";
  fs::create_directories(dir);
  { std::ofstream(dir / "empty.txt"); }
  { std::ofstream(dir / "short.txt") << "hello"; }
  fs::create_directories(dir / "odd");
  { std::ofstream(dir / "odd/train.bin", std::ios::binary) << "abc"; }
  { std::ofstream(dir / "odd/val.bin", std::ios::binary) << "ab"; }
  fs::create_directories(dir / "big");
  {
    std::ofstream train(dir / "big/train.bin", std::ios::binary);
    for (int i = 0; i < 400; ++i) { uint16_t t = i == 7 ? 60000 : 5; train.write(reinterpret_cast<char*>(&t), 2); }
    std::ofstream val(dir / "big/val.bin", std::ios::binary);
    for (int i = 0; i < 400; ++i) { uint16_t t = 5; val.write(reinterpret_cast<char*>(&t), 2); }
  }
  { std::ofstream(dir / "bad.ini") << "max-steps = 5\nbogus-key = 1\n"; }
  std::vector<BadInput> cases = {
      {"--data " + (dir / "missing.txt").string(), "missing.txt"},
      {"--data " + (dir / "empty.txt").string(), "empty.txt"},
      {"--data " + (dir / "short.txt").string() + " --block-size 64", "64"},
      {"--data " + (dir / "odd").string(), "even"},
      {"--data " + (dir / "big").string() + " --vocab-size 50257", "60000"},
      {"--n-embd 100 --n-head 3", "n_embd 100 is not divisible by n_head 3"},
      {"--preset gpt-mini --n-head 5", "not divisible by n_head 5"},
      {"--max-steps 0", "max-steps"},
      {"--lr -1", "lr"},
      {"--batch-size 0", "batch-size"},
      {"--preset gpt-huge", "gpt-huge"},
      {"--strategy zero9", "zero9"},
      {"--config " + (dir / "bad.ini").string(), "bogus-key"},
      {"--no-such-flag", "no-such-flag"},
      {"--device gpu", "unknown device 'gpu'; available: auto, cpu, cuda"},
      {"--optimizer adam", "unknown optimizer 'adam'; available: adamw, sgd"},
      // A strategy-specific option given to a strategy that would ignore it.
      {"--strategy oss --nproc 2 --overlap-comm false",
       "--overlap-comm does not apply to strategy 'oss' (it would be ignored); it is for ddp only"},
      {"--find-unused-parameters",
       "--find-unused-parameters does not apply to strategy 'single' (it would be ignored); it is for ddp, oss"},
      {"--bucket-cap-mb 10", "--bucket-cap-mb does not apply to strategy 'single'"},
      {"--strategy sdp --nproc 2 --bucket-cap-mb 0",
       "invalid value '0' for --bucket-cap-mb: must be > 0 for strategy 'sdp'"},
      {"--nnodes 0", "invalid value '0' for --nnodes: must be >= 1"},
      {"--nnodes 2 --node-rank 2 --master-port 29999",
       "invalid value '2' for --node-rank: must be in [0, nnodes) = [0, 2)"},
      {"--nnodes 2 --strategy ddp", "invalid value '0' for --master-port: must be > 0 with --nnodes > 1"},
      {"--peak-flops -1", "invalid value '-1' for --peak-flops: must be a finite number >= 0"},
      {"--profile " + (dir / "no-such-dir" / "prof").string(), "cannot write --profile"},
  };
  // Asking for CUDA where there is none is bad input too (exit 2, nothing written).
  if (!torch::cuda::is_available()) cases.push_back({"--device cuda", "--device cuda: no CUDA device is usable"});
  for (const auto& c : cases) {
    const auto out = dir / "out";
    fs::remove_all(out);
    auto run = run_gpt_binary(c.args + " --output-dir " + out.string());
    EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.output;
    EXPECT_NE(run.output.find(c.expect), std::string::npos) << c.args << "\n" << run.output;
    // One line: the message, nothing else (no backtrace, no config dump).
    EXPECT_LE(std::count(run.output.begin(), run.output.end(), '\n'), 1) << c.args << "\n" << run.output;
    EXPECT_FALSE(fs::exists(out / "summary.json")) << c.args;
    EXPECT_FALSE(fs::exists(out)) << c.args << ": no output directory for a run that never started";
  }
}

TEST(BadInputTest, UncreatableOutputDirIsOneLineExitTwoAndNothingWritten) {
  // Checked in phase 1, before any rank starts: by the launcher for --nproc 2.
  const auto file = scratch() / "plain-file";
  { std::ofstream(file) << "x"; }
  for (const std::string nproc : {"--nproc 1", "--strategy ddp --nproc 2"}) {
    for (const fs::path& dir : {fs::path("/proc/strata-out"), file / "out", fs::path("/proc")}) {
      const std::string args = nproc + " --max-steps 2" + kQuick + "--output-dir " + dir.string();
      auto run = run_gpt_binary(args);
      EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.output;
      EXPECT_EQ(run.output.rfind("error: cannot use --output-dir '" + dir.string() + "': ", 0), 0u)
          << args << "\n" << run.output;
      EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << args << "\n" << run.output;
      if (dir != "/proc") {
        EXPECT_FALSE(fs::exists(dir)) << args;
      }
    }
  }
  EXPECT_EQ(fs::file_size(file), 1u);  // untouched
}

TEST(BadInputTest, LauncherVariablesAreInputToo) {
  // A world someone else launched: its variables are checked like flags.
  const auto out = scratch() / "bad-env";
  struct Case {
    std::string env, args, expect;
  };
  const std::vector<Case> cases = {
      {"RANK=abc WORLD_SIZE=2", "", "RANK='abc' is not an integer"},
      {"SLURM_PROCID=2 SLURM_NTASKS=2", "", "SLURM_PROCID=2 must be < SLURM_NTASKS=2"},
      {"RANK=0 WORLD_SIZE=2 TORCHELASTIC_USE_AGENT_STORE=True", "",
       "TORCHELASTIC_USE_AGENT_STORE=True is set but TORCHELASTIC_RESTART_COUNT is not"},
      {"RANK=0 WORLD_SIZE=1", "--nnodes 2 --master-port 29999",
       "--nnodes 2 x --nproc 1 disagrees with WORLD_SIZE 1 set by the launcher"},
      {"RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2", "--nproc 4",
       "--nproc 4 disagrees with LOCAL_WORLD_SIZE 2 set by the launcher"},
  };
  for (const auto& c : cases) {
    fs::remove_all(out);
    auto run = run_gpt_binary(c.args + " --strategy ddp --output-dir " + out.string(), c.env);
    EXPECT_EQ(run.exit_code, 2) << c.env << "\n" << run.output;
    EXPECT_NE(run.output.find(c.expect), std::string::npos) << c.env << "\n" << run.output;
    EXPECT_LE(std::count(run.output.begin(), run.output.end(), '\n'), 1) << c.env << "\n" << run.output;
    EXPECT_FALSE(fs::exists(out)) << c.env;
  }
}
TEST(LauncherTest, FsdpSummaryReportsMaxUnitsGatheredAndDescribesUnits) {
  const auto out = scratch() / "fsdp";
  auto run = run_gpt_binary("--strategy fsdp --nproc 2 --max-steps 3" + kQuick + "--output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("\n  unit root: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("per-rank model state with AdamW"), std::string::npos) << run.output;
  std::ifstream in(out / "summary.json");
  std::stringstream text;
  text << in.rdbuf();
  const std::string key = "\"max_units_gathered\": ";
  const auto at = text.str().find(key);
  ASSERT_NE(at, std::string::npos) << text.str();
  const double gathered = std::stod(text.str().substr(at + key.size()));
  EXPECT_EQ(text.str().find(key + "2.0"), std::string::npos) << "a count: " << text.str();
  // limit_all_gathers: at most the running unit and the prefetched one; and
  // gpt-nano has more than one block, so a prefetch did happen.
  EXPECT_LE(gathered, 2.0) << text.str();
  EXPECT_GE(gathered, 1.0) << text.str();
}

}  // namespace
