// stdout_test - strata-gpt's lines reach a pipe or a file as they are
// written (issue 44: `scripts/run | tee log` and CI logs showed them in
// blocks). stdio fully buffers a stdout that is not a terminal. Two things
// flush the line this test waits for: run_gpt line-buffers stdout (setvbuf),
// and the strategy's description is written with std::endl (as the progress
// bar flushes each step line). Either keeps this green; with both removed the
// line sits in the 4 KiB buffer and both cases fail (seen on 2026-12-03).
#include "tests/process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

const fs::path& scratch() {
  static const strata::testing::ScratchDir dir("strata-stdout-test");
  return dir.path();
}

// A job that prints its header, then trains silently for minutes (no step
// line, no validation, no progress bar): the header's last line is in the
// log file (a regular file, buffered as a pipe is) while the job still runs,
// or it was left in the buffer.
void expect_header_while_running(const std::string& name, const std::vector<std::string>& extra,
                                 const std::string& last_header_line) {
  std::vector<std::string> argv = {STRATA_GPT_BINARY, "--preset", "gpt-nano", "--data", "addition:2",
                                   "--max-steps", "1000000", "--log-every-n-steps", "1000000",
                                   "--val-check-interval", "0", "--progress-bar", "false", "--threads-per-rank",
                                   "1", "--output-dir", (scratch() / name).string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  strata::testing::Process job(argv, strata::testing::base_environment(), scratch() / (name + ".log"));
  ASSERT_TRUE(job.started());
  const bool seen = strata::testing::wait_until(
      [&] { return job.output().find(last_header_line) != std::string::npos || !job.running(); }, 120s);
  EXPECT_TRUE(seen && job.running()) << "the header's last line '" << last_header_line
                                     << "' did not arrive while the job ran:\n"
                                     << job.output();
}

TEST(StdoutTest, TheHeaderArrivesWhileTheJobRunsAtOneRank) {
  expect_header_while_running("single", {}, "single: world size 1\n");
}

TEST(StdoutTest, TheHeaderArrivesWhileTheJobRunsAtTwoRanks) {
  expect_header_while_running("ddp", {"--strategy", "ddp", "--nproc", "2"}, "ddp: 2 ranks");
}

}  // namespace
