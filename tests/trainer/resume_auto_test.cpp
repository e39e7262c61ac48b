// resume_auto_test - --resume auto, one command for a job's first start and
// every restart, restarted by hand here (torchrun --max-restarts:
// tests/launch/external_launchers_test.cpp): a first start with no checkpoint
// starts fresh; after a rank is SIGKILLed the same command resumes from the
// newest complete checkpoint, skipping a torn one and one with a flipped bit,
// and the metrics equal an uninterrupted run's; a finished run is never
// overwritten.
#include "tests/process.h"
#include "tests/run_binary.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {
namespace fs = std::filesystem;
using strata::testing::losses_of;
using strata::testing::run_gpt_binary;

fs::path scratch(const std::string& name) {
  static const fs::path dir = fs::temp_directory_path() / ("strata-resume-auto-" + std::to_string(::getpid()));
  const fs::path path = dir / name;
  fs::remove_all(path);
  return path;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// ddp on 2 ranks, dropout on (each rank's generators must resume too).
const std::string kRun =
    " --preset gpt-nano --data addition:2 --threads-per-rank 1 --progress-bar false --limit-val-batches 2"
    " --log-every-n-steps 1 --comm-timeout 30 --lr 3e-4 --min-lr 3e-4 --warmup-steps 0 --val-check-interval 4"
    " --strategy ddp --nproc 2 --batch-size 4 --dropout 0.1 ";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ResumeAutoTest, OneCommandStartsFreshResumesAfterAKillAndSkipsATornOrRottenCheckpoint) {
  const fs::path straight = scratch("straight");
  const fs::path out = scratch("job");
  const fs::path marker = scratch("killed-once");
  auto run = run_gpt_binary(kRun + "--max-steps 12 --output-dir " + straight.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const std::string job = kRun + "--max-steps 12 --checkpoint-every 4 --resume auto --output-dir " + out.string();
  const std::string kill =
      "STRATA_TEST_KILL_AT_STEP=7 STRATA_TEST_KILL_RANK=1 STRATA_TEST_KILL_ONCE=" + marker.string();
  // First start: nothing to resume; rank 1 dies at step 7 (after step-4 is published).
  run = run_gpt_binary(job, kill);
  ASSERT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "--resume auto: no complete checkpoint in '" + (out / "checkpoints").string() +
                                       "': starting fresh"))
      << run.output;
  ASSERT_TRUE(fs::is_directory(out / "checkpoints" / "step-4")) << run.output;
  ASSERT_FALSE(fs::exists(out / "checkpoints" / "step-8")) << run.output;

  // A torn checkpoint newer than step-4 (a copy whose data file lost its tail,
  // as a disk that filled up would leave it): skipped, never loaded.
  const fs::path torn = out / "checkpoints" / "step-6";
  fs::copy(out / "checkpoints" / "step-4", torn, fs::copy_options::recursive);
  fs::path data_file;
  for (const auto& entry : fs::directory_iterator(torn)) {
    if (entry.path().filename() != "metadata.json") data_file = entry.path();
  }
  ASSERT_FALSE(data_file.empty());
  fs::resize_file(data_file, fs::file_size(data_file) / 2);
  // And bit rot: another copy with one bit flipped in its data (sizes and
  // metadata intact, so only the block's CRC can tell).
  const fs::path rotten = out / "checkpoints" / "step-5";
  fs::copy(out / "checkpoints" / "step-4", rotten, fs::copy_options::recursive);
  const fs::path rotten_data = rotten / data_file.filename();
  {
    std::fstream f(rotten_data, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(rotten_data) / 3);
    f.seekg(at);
    const char c = static_cast<char>(f.get() ^ 0x10);
    f.seekp(at);
    f.put(c);
  }

  // The restart: the same command (the marker disarms the kill).
  run = run_gpt_binary(job, kill);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "--resume auto: skipping an incomplete or corrupt checkpoint: " + torn.string() +
                                       ": data file '" + data_file.string() + "' has "))
      << run.output;
  EXPECT_TRUE(contains(run.output, "--resume auto: skipping an incomplete or corrupt checkpoint: " +
                                       rotten.string() + ": data file '" + rotten_data.string() +
                                       "' block 0 is corrupt (crc32 "))
      << run.output;
  EXPECT_TRUE(contains(run.output, "--resume auto: resuming from '" + (out / "checkpoints" / "step-4").string() +
                                       "' (step 4)"))
      << run.output;
  // The metrics of one uninterrupted run, steps 5-7 of the killed attempt dropped.
  const auto losses = losses_of(out / "metrics.csv");
  ASSERT_EQ(losses.size(), 15u);  // 12 training rows, 3 validation rows (every 4 steps)
  EXPECT_EQ(losses, losses_of(straight / "metrics.csv"));

  // Once more, after the job finished: nothing left to train, and nothing touched.
  const std::string metrics = read_text(out / "metrics.csv");
  run = run_gpt_binary(job);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(contains(run.output, "not below --max-steps 12")) << run.output;
  EXPECT_EQ(read_text(out / "metrics.csv"), metrics);
}

TEST(ResumeAutoTest, AFinishedRunWithoutCheckpointsIsNeverOverwritten) {
  const fs::path out = scratch("finished");
  const std::string job = kRun + "--max-steps 2 --resume auto --output-dir " + out.string();
  auto run = run_gpt_binary(job);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string metrics = read_text(out / "metrics.csv");
  const std::string summary = read_text(out / "summary.json");
  run = run_gpt_binary(job);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(contains(run.output, "--resume auto: '" + out.string() +
                                       "' holds a finished run (summary.json) and no complete checkpoint to resume"))
      << run.output;
  EXPECT_EQ(read_text(out / "metrics.csv"), metrics);
  EXPECT_EQ(read_text(out / "summary.json"), summary);
}

}  // namespace
