// checkpoint_compat_test - checkpoints written by the LibTorch 1.13 build
// (tests/fixtures/libtorch-1.13, both formats) resume in this build: the
// resumed run logs the 1.13 run's losses for the steps after the checkpoint.
#include "tests/run_binary.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "libtorch-1.13";

// The flags the fixtures were written with (their README), less the
// checkpointing: the resumed run must continue the same configuration (the
// betas too: a checkpoint keeps the moments, not the optimizer's options).
const std::string kCommon =
    " --preset gpt-nano --n-layer 1 --n-embd 24 --n-head 2 --data addition:2 --nproc 2"
    " --threads-per-rank 1 --max-steps 8 --log-every-n-steps 1 --val-check-interval 4"
    " --limit-val-batches 2 --batch-size 8 --progress-bar false --seed 7 --lr 1e-2"
    " --warmup-steps 1 --min-lr 1e-3 --comm-timeout 30 --adam-beta2 0.95 ";

/// step -> training loss of a metrics.csv (validation rows skipped).
std::map<int, double> training_losses(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);  // header: step,loss,...
  std::map<int, double> out;
  while (std::getline(in, line)) {
    std::stringstream cells(line);
    std::string step, loss;
    std::getline(cells, step, ',');
    std::getline(cells, loss, ',');
    if (!loss.empty()) out[std::stoi(step)] = std::stod(loss);
  }
  return out;
}

void expect_resumes_like_libtorch_113(const std::string& fixture, const std::string& flags) {
  const strata::testing::TempDir tmp("strata-compat");
  // A copy: the resumed run must not be able to touch the committed files.
  const fs::path checkpoint = tmp.path() / "step-4";
  fs::copy(kFixtures / (fixture + "-step-4"), checkpoint, fs::copy_options::recursive);
  const fs::path out = tmp.path() / "out";
  const auto run = run_gpt_binary(kCommon + flags + " --resume " + checkpoint.string() + " --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const auto want = training_losses(kFixtures / (fixture + "-metrics.csv"));
  const auto got = training_losses(out / "metrics.csv");
  ASSERT_EQ(got.size(), 4u) << "steps 5-8 only, once each";
  // Why 1e-4 relative: the 1.13 build ran OpenBLAS, this one MKL and newer
  // kernels, so fp32 rounding differs and 4 AdamW steps carry it; a resume that
  // lost the weights or the optimizer state starts from step 1's loss, which is
  // far outside (checked below, so the tolerance can fail).
  constexpr double kRel = 1e-4;
  ASSERT_GT(std::abs(want.at(1) - want.at(5)), 100 * kRel * want.at(5));
  for (int step = 5; step <= 8; ++step) {
    ASSERT_TRUE(got.count(step)) << "step " << step << " missing";
    EXPECT_NEAR(got.at(step), want.at(step), kRel * want.at(step)) << fixture << " step " << step;
  }
}

TEST(CheckpointCompatTest, FullCheckpointFromLibTorch113ResumesUnderDdp) {
  expect_resumes_like_libtorch_113("full-ddp2", "--strategy ddp");
}

TEST(CheckpointCompatTest, ShardedCheckpointFromLibTorch113ResumesUnderFsdp) {
  expect_resumes_like_libtorch_113("sharded-fsdp2", "--strategy fsdp");
}

}  // namespace
