// flight_test - the flight recorder end to end, through the real strata-gpt
// and its launcher: a rank stopped mid-run (SIGSTOP) is named with the
// collective the others wait in, within the comm timeout plus 10 s, and
// nothing is left running; a rank that skips one collective (the testing
// aid) is named as a mismatch; SIGUSR1 dumps a running job, which goes on;
// Ctrl-C is no rank's failure; strata-flight reads a directory of dumps.
#include "strata/trainer/checkpoint.h"
#include "tests/process.h"
#include "tests/run_binary.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using strata::testing::Process;
using strata::testing::read_text;
using strata::testing::wait_until;

const fs::path& scratch() {
  static const strata::testing::ScratchDir dir("strata-flight-test");
  return dir.path();
}

/// The pids of `launcher`'s children, by their RANK variable.
std::vector<pid_t> ranks_of(pid_t launcher, int world) {
  std::vector<pid_t> pids(world, -1);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_text(entry.path() / "stat");
    const auto paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (std::sscanf(stat.c_str() + paren + 1, " %c %d", &state, &ppid) != 2 || ppid != launcher) continue;
    // NUL-separated KEY=VALUE entries; the leading NUL tells RANK from LOCAL_RANK.
    const std::string env = std::string(1, '\0') + read_text(entry.path() / "environ");
    for (int r = 0; r < world; ++r) {
      if (env.find(std::string("\0RANK=", 6) + std::to_string(r) + '\0') != std::string::npos) {
        pids[r] = std::stoi(name);
      }
    }
  }
  return pids;
}

std::string flight_binary() { return fs::path(STRATA_GPT_BINARY).parent_path() / "strata-flight"; }

// The issue's acceptance: fsdp x3 gpt-mini, a short --comm-timeout, one rank
// stopped mid-run with SIGSTOP.
TEST(FlightTest, AStoppedRankIsNamedWithTheCollectiveTheOthersWaitIn) {
  const fs::path out = scratch() / "stopped";
  constexpr double kTimeout = 5.0;
  Process job({STRATA_GPT_BINARY, "--preset", "gpt-mini", "--strategy", "fsdp", "--nproc", "3", "--max-steps",
               "100000", "--comm-timeout", "5", "--checkpoint-every", "2", "--log-every-n-steps", "1",
               "--progress-bar", "false",
               "--output-dir", out.string()},
              strata::testing::base_environment(), scratch() / "stopped.log");
  ASSERT_TRUE(job.started());
  // Training, with a checkpoint behind it.
  ASSERT_TRUE(wait_until([&] { return fs::exists(out / "checkpoints" / "step-4"); }, 180s)) << job.output();
  const std::vector<pid_t> ranks = ranks_of(job.pid(), 3);
  for (int r = 0; r < 3; ++r) ASSERT_GT(ranks[r], 0) << "rank " << r << " not found\n" << job.output();

  // SIGUSR1: a running job dumps, and goes on.
  ::kill(ranks[2], SIGUSR1);
  ASSERT_TRUE(wait_until([&] { return fs::exists(out / "flight" / "rank2.json"); }, 10s)) << job.output();
  const auto live = nlohmann::json::parse(read_text(out / "flight" / "rank2.json"));
  EXPECT_EQ(live["rank"], 2);
  EXPECT_GT(live["records"].size(), 10u);

  ::kill(ranks[1], SIGSTOP);
  const auto stopped_at = std::chrono::steady_clock::now();
  const auto code = job.wait_for(std::chrono::milliseconds(static_cast<int64_t>((kTimeout + 30) * 1000)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  const std::string output = job.output();
  ASSERT_TRUE(code.has_value()) << "still running " << seconds << " s after SIGSTOP\n" << output;
  EXPECT_NE(*code, 0) << output;
  EXPECT_LE(seconds, kTimeout + 10) << output;
  // Rank 1 may have been stopped part-way through a collective (Gloo's
  // emulated all-gather is one broadcast per rank): a rank that got its
  // part through waits in the next one.
  const std::regex line(
      "strata: flight recorder: rank 1 wrote no dump \\(stopped, hung or killed\\) and holds up collective #[0-9]+ "
      "of group 'world' \\([a-z_]+, step [0-9]+ [a-z ]+(, unit [a-z0-9 ]+)?, [0-9.]+ (B|KiB|MiB)\\); (rank [02] "
      "has|ranks 0, 2 have) waited in it for [0-9.]+ s");
  std::smatch found;
  EXPECT_TRUE(std::regex_search(output, found, line)) << output;
  for (pid_t pid : ranks) EXPECT_FALSE(fs::exists("/proc/" + std::to_string(pid))) << "rank pid " << pid << " left";

  // Outputs intact: the config, the metrics, and the newest checkpoint complete.
  EXPECT_TRUE(fs::exists(out / "config.ini"));
  EXPECT_NE(read_text(out / "metrics.csv").find("step,loss"), std::string::npos);
  std::vector<fs::path> steps;
  for (const auto& e : fs::directory_iterator(out / "checkpoints")) steps.push_back(e.path());
  ASSERT_FALSE(steps.empty());
  std::sort(steps.begin(), steps.end(), [](const fs::path& a, const fs::path& b) {
    return std::stoll(a.filename().string().substr(5)) < std::stoll(b.filename().string().substr(5));
  });
  EXPECT_EQ(strata::checkpoint_incomplete_reason(steps.back().string()), "") << steps.back();

  // A user, afterwards: the same line, and each rank's last collectives.
  const auto report = strata::testing::run_command(flight_binary() + " " + out.string() + " --last 2");
  EXPECT_EQ(report.exit_code, 0) << report.output;
  ASSERT_FALSE(found.empty());
  EXPECT_NE(report.output.find(found.str().substr(std::string("strata: flight recorder: ").size())),
            std::string::npos)
      << report.output;
  EXPECT_TRUE(std::regex_search(report.output, std::regex("rank 0: [0-9]+ collectives kept, the last:")))
      << report.output;
  EXPECT_NE(report.output.find("in flight for"), std::string::npos) << report.output;
}

// Two ways a skipped collective ends: #18 (the root unit's all-gather, 1.4
// KiB) pairs with unit h0's (36.8 KiB) and Gloo aborts the receiving ranks
// from a worker thread (the terminate handler must dump); #60 pairs two
// all-gathers of one size and the ranks wait until the timeout.
TEST(FlightTest, ARankThatSkipsACollectiveIsNamedAsAMismatch) {
  for (const int skip : {18, 60}) {
    const fs::path out = scratch() / ("skipped-" + std::to_string(skip));
    const auto run = strata::testing::run_gpt_binary(
        "--preset gpt-nano --data addition:2 --batch-size 2 --threads-per-rank 1 --progress-bar false "
        "--strategy fsdp --nproc 3 --max-steps 20 --comm-timeout 3 --output-dir " + out.string(),
        "STRATA_TEST_SKIP_COLLECTIVE=" + std::to_string(skip) + " STRATA_TEST_SKIP_RANK=1");
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("STRATA_TEST_SKIP_COLLECTIVE: collective #" + std::to_string(skip)), std::string::npos)
        << run.output;
    const std::regex line("strata: flight recorder: at #" + std::to_string(skip) +
                          " of group 'world' rank 1 called all_gather \\(step [0-9]+ [a-z]+, unit [a-z0-9]+\\) "
                          "[0-9.]+ KiB; ranks 0, 2 called all_gather \\(step [0-9]+ [a-z]+, unit [a-z0-9]+\\)");
    EXPECT_TRUE(std::regex_search(run.output, line)) << "skip #" << skip << "\n" << run.output;
  }
}

// Ctrl-C in a terminal signals the launcher and its ranks alike: the ranks
// die of SIGINT while the launcher asks them for dumps; they were stopped,
// not failing on their own.
TEST(FlightTest, CtrlCStopsTheJobWithoutNamingRanksAsFailed) {
  const fs::path out = scratch() / "interrupted";
  Process job({STRATA_GPT_BINARY, "--preset", "gpt-nano", "--data", "addition:2", "--batch-size", "2",
               "--threads-per-rank", "1", "--progress-bar", "false", "--strategy", "ddp", "--nproc", "2",
               "--max-steps", "100000", "--log-every-n-steps", "1", "--output-dir", out.string()},
              strata::testing::base_environment(), scratch() / "interrupted.log");
  ASSERT_TRUE(job.started());
  ASSERT_TRUE(wait_until([&] { return strata::testing::losses_of(out / "metrics.csv").size() >= 2; }, 120s))
      << job.output();
  ::kill(-job.pid(), SIGINT);  // the whole process group, as a terminal does
  const auto code = job.wait_for(30s);
  ASSERT_TRUE(code.has_value()) << job.output();
  EXPECT_EQ(*code, 128 + SIGINT) << job.output();
  EXPECT_EQ(job.output().find(" failed ("), std::string::npos) << job.output();
}

TEST(FlightTest, StrataFlightRefusesADirectoryWithoutDumps) {
  const auto run = strata::testing::run_command(flight_binary() + " " + scratch().string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("error: no flight-recorder dump (rank<R>.json) in '" + scratch().string() + "'"),
            std::string::npos)
      << run.output;
}

}  // namespace
