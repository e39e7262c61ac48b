// resume_test - exact resume through the strata-gpt binary (real processes, so
// every rank has its own random generators): an interrupted run resumed from
// its checkpoint logs the uninterrupted run's metrics bit for bit, under every
// strategy, with dropout on; metrics.csv reads as one run; --resume last; a
// resume on another world size stays within tolerance; bad resumes exit 2.
#include "tests/run_binary.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

fs::path scratch(const std::string& name) {
  static const fs::path dir = fs::temp_directory_path() / ("strata-resume-" + std::to_string(::getpid()));
  const fs::path path = dir / name;
  fs::remove_all(path);
  return path;
}

// A row per step; validation every 4 steps (--max-steps 8 runs validate at
// the same steps whether interrupted at 4 or not).
const std::string kRun =
    " --preset gpt-nano --data addition:2 --threads-per-rank 1 --progress-bar false --limit-val-batches 2"
    " --log-every-n-steps 1 --comm-timeout 30 --lr 3e-4 --min-lr 3e-4 --warmup-steps 0 ";
// (A constant lr: runs of different --max-steps follow the same schedule.)
const std::string kVal4 = " --val-check-interval 4 ";

struct Csv {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  /// The cells of `columns`, one line per row ("" for a missing column).
  std::string columns(const std::vector<std::string>& columns) const {
    std::string out;
    for (const auto& row : rows) {
      for (const auto& name : columns) {
        size_t c = 0;
        while (c < header.size() && header[c] != name) ++c;
        out += (c < row.size() ? row[c] : std::string("?")) + ",";
      }
      out += "\n";
    }
    return out;
  }
  /// step -> training loss, failing on a step with two training rows.
  std::map<int64_t, double> losses() const {
    std::map<int64_t, double> out;
    size_t loss = 0;
    while (loss < header.size() && header[loss] != "loss") ++loss;
    for (const auto& row : rows) {
      if (loss >= row.size() || row[loss].empty()) continue;
      const int64_t step = std::stoll(row[0]);
      EXPECT_EQ(out.count(step), 0u) << "step " << step << " logged twice";
      out[step] = std::stod(row[loss]);
    }
    return out;
  }
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells(1);
  for (char c : line) {
    if (c == ',') cells.emplace_back();
    else cells.back() += c;
  }
  return cells;
}

Csv read_csv(const fs::path& path) {
  std::ifstream in(path);
  Csv csv;
  std::string line;
  if (std::getline(in, line)) csv.header = split(line);
  while (std::getline(in, line)) {
    EXPECT_NE(line.rfind("step,", 0), 0u) << "a second header in " << path;
    csv.rows.push_back(split(line));
  }
  return csv;
}

/// The columns that depend on the training only (not on timing).
const std::vector<std::string> kExact = {"step", "loss", "lr", "grad_norm", "val_loss", "val_accuracy"};

std::vector<torch::Tensor> load_params(const fs::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  std::vector<torch::Tensor> out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    archive.read(key, t);
    out.push_back(t);
  }
  return out;
}

struct World {
  std::string strategy;
  int nproc;
  int batch_size;  ///< per rank: the global batch is the same for every entry
  std::string args() const {
    return " --strategy " + strategy + " --nproc " + std::to_string(nproc) + " --batch-size " +
           std::to_string(batch_size) + " ";
  }
};

TEST(ResumeTest, InterruptedRunResumesBitIdenticallyUnderEveryStrategy) {
  for (const World& world : {World{"single", 1, 8}, World{"ddp", 2, 4}, World{"oss", 2, 4}, World{"sdp", 2, 4},
                             World{"fsdp", 2, 4}}) {
    SCOPED_TRACE(world.strategy);
    const fs::path straight = scratch(world.strategy + "-straight");
    const fs::path resumed = scratch(world.strategy + "-resumed");
    const std::string common = kRun + kVal4 + world.args() + "--dropout 0.1 --max-steps 8 ";
    auto run = run_gpt_binary(common + "--output-dir " + straight.string() + " --dump-params " +
                              (straight / "params.pt").string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    // Interrupted: rank 0 fails at the start of step 7, after the step-4
    // checkpoint; its metrics.csv holds rows up to 6.
    run = run_gpt_binary(common + "--checkpoint-every 4 --output-dir " + resumed.string(),
                         "STRATA_TEST_FAIL_AT_STEP=7 STRATA_TEST_FAIL_RANK=0");
    ASSERT_NE(run.exit_code, 0) << run.output;
    ASSERT_TRUE(fs::exists(resumed / "checkpoints" / "step-4")) << run.output;
    ASSERT_EQ(read_csv(resumed / "metrics.csv").losses().rbegin()->first, 6) << run.output;
    run = run_gpt_binary(common + "--checkpoint-every 4 --resume last --output-dir " + resumed.string() +
                         " --dump-params " + (resumed / "params.pt").string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.output.find("re-seeded"), std::string::npos) << run.output;

    const Csv a = read_csv(straight / "metrics.csv");
    const Csv b = read_csv(resumed / "metrics.csv");
    EXPECT_EQ(a.losses().size(), 8u);
    EXPECT_EQ(b.columns(kExact), a.columns(kExact));  // steps 1..8 once each, the same values
    const auto pa = load_params(straight / "params.pt");
    const auto pb = load_params(resumed / "params.pt");
    ASSERT_EQ(pa.size(), pb.size());
    ASSERT_FALSE(pa.empty());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  }
}

TEST(ResumeTest, ResumeLastIntoTheSameOutputDirAppendsToMetricsCsv) {
  // The README's scenario: 10 steps with a checkpoint every 5, then
  // --resume last --max-steps 20 into the same directory. Validation every 5
  // steps: the 10-step run's final validation is one the 20-step run has too.
  const fs::path straight = scratch("e2e-straight");
  const fs::path out = scratch("e2e");
  const std::string common = kRun + " --val-check-interval 5 --strategy ddp --nproc 2 --batch-size 4 --dropout 0.1 ";
  auto run = run_gpt_binary(common + "--max-steps 20 --output-dir " + straight.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = run_gpt_binary(common + "--max-steps 10 --checkpoint-every 5 --checkpoint-monitor val_loss "
                       "--output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = run_gpt_binary(common + "--max-steps 20 --checkpoint-every 5 --checkpoint-monitor val_loss "
                       "--resume last --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const Csv a = read_csv(straight / "metrics.csv");
  const Csv b = read_csv(out / "metrics.csv");
  const auto losses = b.losses();
  ASSERT_EQ(losses.size(), 20u);
  EXPECT_EQ(losses.begin()->first, 1);
  EXPECT_EQ(losses.rbegin()->first, 20);
  EXPECT_EQ(b.columns(kExact), a.columns(kExact));
  // config.ini names the checkpoint "last" resolved to; summary.json is the new run's.
  std::ifstream ini(out / "config.ini");
  std::stringstream text;
  text << ini.rdbuf();
  EXPECT_NE(text.str().find("resume = " + (out / "checkpoints" / "step-10").string() + "\n"), std::string::npos)
      << text.str();
  std::ifstream summary(out / "summary.json");
  std::stringstream summary_text;
  summary_text << summary.rdbuf();
  EXPECT_NE(summary_text.str().find("\"steps\": 20"), std::string::npos) << summary_text.str();
  // The best checkpoint by val_loss is named and kept.
  std::ifstream best_file(out / "checkpoints" / "best");
  std::string best;
  std::getline(best_file, best);
  ASSERT_FALSE(best.empty());
  EXPECT_TRUE(fs::is_directory(out / "checkpoints" / best)) << best;
}

TEST(ResumeTest, AnotherWorldSizeWithTheSameGlobalBatchStaysWithinTolerance) {
  // Dropout off. Pairs whose optimizer state loads across the change today;
  // add a line per pair that becomes loadable.
  const std::vector<std::pair<World, World>> pairs = {
      {World{"single", 1, 8}, World{"ddp", 2, 4}},
      {World{"ddp", 2, 4}, World{"single", 1, 8}},
  };
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(from.strategy + " -> " + to.strategy);
    const fs::path straight = scratch("x-straight-" + from.strategy);
    const fs::path out = scratch("x-" + from.strategy + "-" + to.strategy);
    const std::string common = kRun + kVal4 + "--dropout 0 ";
    auto run = run_gpt_binary(common + from.args() + "--max-steps 8 --output-dir " + straight.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    run = run_gpt_binary(common + from.args() + "--max-steps 4 --checkpoint-every 4 --output-dir " + out.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    run = run_gpt_binary(common + to.args() + "--max-steps 8 --resume last --output-dir " + out.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("re-seeded"), std::string::npos) << run.output;
    const auto a = read_csv(straight / "metrics.csv").losses();
    const auto b = read_csv(out / "metrics.csv").losses();
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (const auto& [step, loss] : a) EXPECT_NEAR(b.at(step), loss, 1e-5) << "step " << step;
  }
}

TEST(ResumeTest, BadResumesAreOneLineErrorsWithExitCodeTwo) {
  const fs::path out = scratch("bad");
  const std::string common = kRun + kVal4 + " --strategy single --batch-size 4 ";
  auto run = run_gpt_binary(common + "--max-steps 2 --resume last --output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--resume last: no checkpoint (step-<N> directory) in '" +
                            (out / "checkpoints").string() + "'"),
            std::string::npos)
      << run.output;
  run = run_gpt_binary(common + "--max-steps 2 --checkpoint-every 2 --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const char* max_steps : {"2", "1"}) {
    run = run_gpt_binary(common + "--max-steps " + max_steps + " --resume last --output-dir " + out.string());
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("is at step 2, not below --max-steps " + std::string(max_steps)), std::string::npos)
        << run.output;
  }
  // 8 samples seen; 3 ranks x 4 cannot continue at a whole micro-batch: said
  // once, by the launcher, before any rank starts.
  run = run_gpt_binary(kRun + kVal4 + "--strategy ddp --nproc 3 --batch-size 4 --max-steps 4 --resume last "
                       "--output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("error: --resume: checkpoint '" + (out / "checkpoints" / "step-2").string() +
                            "' stopped after 8 training samples, which is not a whole number of micro-batches of "
                            "batch_size 4 x 3 rank(s)"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;
  run = run_gpt_binary(common + "--max-steps 4 --resume " + (out / "nope").string() + " --output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("is not a directory"), std::string::npos) << run.output;
}

}  // namespace
