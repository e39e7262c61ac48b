// Launch: environment parsing (torchrun incl. its agent store, SLURM, Open
// MPI, strata's own launcher), spawning and stopping ranks.
#include "strata/launch/environment.h"
#include "strata/launch/launcher.h"
#include "tests/error_text.h"
#include "tests/temp_dir.h"
#include "tests/scoped_env.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

namespace {
using strata::testing::ScopedEnv;
using strata::testing::TempDir;

namespace fs = std::filesystem;
using strata::dist_env_from;
using strata::DistEnv;
using strata::LaunchOptions;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using strata::testing::what_of;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// --- dist_env_from -----------------------------------------------------------------

TEST(DistEnvTest, NoLauncherVariablesMeansNoWorld) {
  EXPECT_FALSE(dist_env_from({}).has_value());
  EXPECT_FALSE(dist_env_from({{"HOME", "/root"}, {"MASTER_PORT", "1234"}}).has_value());
}

TEST(DistEnvTest, ReadsTorchrunVariables) {
  const auto d = dist_env_from({{"RANK", "5"},
                                {"WORLD_SIZE", "8"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "4"},
                                {"MASTER_ADDR", "10.0.0.7"},
                                {"MASTER_PORT", "29411"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 5);
  EXPECT_EQ(d->world_size, 8);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->local_world_size, 4);
  EXPECT_EQ(d->master_addr, "10.0.0.7");
  EXPECT_EQ(d->master_port, 29411);
  EXPECT_TRUE(d->from_environment);
}

TEST(DistEnvTest, TorchrunDefaultsForOptionalVariables) {
  const auto d = dist_env_from({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->local_world_size, 2);
  EXPECT_EQ(d->master_addr, "127.0.0.1");
  EXPECT_EQ(d->master_port, 29500);
}

TEST(DistEnvTest, ReadsSlurmVariables) {
  const auto d = dist_env_from({{"SLURM_PROCID", "3"},
                                {"SLURM_NTASKS", "4"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NTASKS_PER_NODE", "2"},
                                {"MASTER_ADDR", "node001"},
                                {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(d->world_size, 4);
  EXPECT_EQ(d->local_rank, 1);
  EXPECT_EQ(d->local_world_size, 2);
  EXPECT_EQ(d->master_addr, "node001");
  EXPECT_EQ(d->master_port, 1234);

  const auto list = dist_env_from(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "7"}, {"SLURM_TASKS_PER_NODE", "3(x2),1"}});
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(list->local_world_size, 3);
  EXPECT_EQ(list->master_addr, "127.0.0.1");
  EXPECT_EQ(list->master_port, 29500);
}

TEST(DistEnvTest, ReadsOpenMpiVariables) {
  const auto d = dist_env_from({{"OMPI_COMM_WORLD_RANK", "2"},
                                {"OMPI_COMM_WORLD_SIZE", "3"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 2);
  EXPECT_EQ(d->world_size, 3);
  EXPECT_EQ(d->local_rank, 0);
  EXPECT_EQ(d->local_world_size, 1);
}

TEST(DistEnvTest, TorchrunVariablesWinOverSlurm) {
  // Our launcher sets RANK for ranks it spawns inside a SLURM allocation.
  const auto d = dist_env_from(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->rank, 1);
  EXPECT_EQ(d->world_size, 2);
}

TEST(DistEnvTest, BadValuesAreErrorsNamingVariableAndValue) {
  auto msg = what_of([] { dist_env_from({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}); });
  EXPECT_CONTAINS(msg, "RANK='abc' is not an integer");
  msg = what_of([] { dist_env_from({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}); });
  EXPECT_CONTAINS(msg, "WORLD_SIZE='2x' is not an integer");
  msg = what_of([] { dist_env_from({{"RANK", "4"}, {"WORLD_SIZE", "4"}}); });
  EXPECT_CONTAINS(msg, "RANK=4 must be < WORLD_SIZE=4");
  msg = what_of([] { dist_env_from({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}); });
  EXPECT_CONTAINS(msg, "RANK=-1 must be >= 0");
  msg = what_of([] { dist_env_from({{"RANK", "0"}, {"WORLD_SIZE", "0"}}); });
  EXPECT_CONTAINS(msg, "WORLD_SIZE=0 must be >= 1");
  msg = what_of([] { dist_env_from({{"WORLD_SIZE", "2"}}); });
  EXPECT_CONTAINS(msg, "WORLD_SIZE is set but RANK is not");
  msg = what_of([] { dist_env_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}); });
  EXPECT_CONTAINS(msg, "MASTER_PORT=70000 must be in [1, 65535]");
  msg = what_of([] {
    dist_env_from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  });
  EXPECT_CONTAINS(msg, "LOCAL_RANK=2 must be < LOCAL_WORLD_SIZE=2");
  msg = what_of([] { dist_env_from({{"SLURM_PROCID", "x1"}, {"SLURM_NTASKS", "2"}}); });
  EXPECT_CONTAINS(msg, "SLURM_PROCID='x1' is not an integer");
  msg = what_of([] { dist_env_from({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}}); });
  EXPECT_CONTAINS(msg, "SLURM_PROCID=2 must be < SLURM_NTASKS=2");
  msg = what_of([] { dist_env_from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "-3"}}); });
  EXPECT_CONTAINS(msg, "OMPI_COMM_WORLD_SIZE=-3 must be >= 1");
}

TEST(DistEnvTest, TorchrunAgentStoreMakesEveryRankAClientUnderTheAttemptPrefix) {
  // What torch 1.13's LocalElasticAgent sets under the default (static) rendezvous.
  std::map<std::string, std::string> env = {{"RANK", "0"},
                                            {"WORLD_SIZE", "2"},
                                            {"LOCAL_RANK", "0"},
                                            {"LOCAL_WORLD_SIZE", "2"},
                                            {"GROUP_RANK", "0"},
                                            {"ROLE_RANK", "0"},
                                            {"ROLE_WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", "29400"},
                                            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                            {"TORCHELASTIC_RUN_ID", "job-7"},
                                            {"TORCHELASTIC_RESTART_COUNT", "3"},
                                            {"TORCHELASTIC_MAX_RESTARTS", "5"}};
  auto d = dist_env_from(env);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->agent_store);
  EXPECT_EQ(d->store_prefix, "/worker/attempt_3");
  EXPECT_EQ(d->store_file, "");
  EXPECT_EQ(d->master_port, 29400);

  // torchrun's c10d rendezvous sets False: rank 0 hosts the store, no prefix.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  d = dist_env_from(env);
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(d->agent_store);
  EXPECT_EQ(d->store_prefix, "");

  // Only torch's exact spelling counts, as in rendezvous.py.
  env["TORCHELASTIC_USE_AGENT_STORE"] = "true";
  EXPECT_FALSE(dist_env_from(env)->agent_store);

  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env.erase("TORCHELASTIC_RESTART_COUNT");
  EXPECT_CONTAINS(what_of([&] { dist_env_from(env); }),
                  "TORCHELASTIC_USE_AGENT_STORE=True is set but TORCHELASTIC_RESTART_COUNT is not");
  env["TORCHELASTIC_RESTART_COUNT"] = "-1";
  EXPECT_CONTAINS(what_of([&] { dist_env_from(env); }), "TORCHELASTIC_RESTART_COUNT=-1 must be >= 0");
  env["TORCHELASTIC_RESTART_COUNT"] = "x";
  EXPECT_CONTAINS(what_of([&] { dist_env_from(env); }), "TORCHELASTIC_RESTART_COUNT='x' is not an integer");
}

TEST(DistEnvTest, StrataStoreFileAndGlooInterfaces) {
  auto d = dist_env_from({{"RANK", "1"},
                          {"WORLD_SIZE", "2"},
                          {"STRATA_STORE_FILE", "/tmp/x/store"},
                          {"GLOO_SOCKET_IFNAME", "eth1,eth2"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->store_file, "/tmp/x/store");
  EXPECT_FALSE(d->agent_store);
  EXPECT_EQ(d->gloo_interfaces, "eth1,eth2");
  // SLURM and Open MPI ranks: rank 0 hosts the TCP store.
  d = dist_env_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"GLOO_SOCKET_IFNAME", "ib0"}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->store_file, "");
  EXPECT_FALSE(d->agent_store);
  EXPECT_EQ(d->gloo_interfaces, "ib0");

  EXPECT_CONTAINS(what_of([] { dist_env_from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"STRATA_STORE_FILE", ""}}); }),
                  "STRATA_STORE_FILE is set but empty");
  EXPECT_CONTAINS(what_of([] {
                    dist_env_from({{"RANK", "0"},
                                   {"WORLD_SIZE", "1"},
                                   {"STRATA_STORE_FILE", "/tmp/s"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                   {"TORCHELASTIC_RESTART_COUNT", "0"}});
                  }),
                  "STRATA_STORE_FILE='/tmp/s' and TORCHELASTIC_USE_AGENT_STORE=True are both set");
}

TEST(DistEnvTest, CurrentEnvironmentReflectsTheProcess) {
  ScopedEnv var("STRATA_LAUNCH_TEST_VAR", "a=b");
  const auto env = strata::current_environment();
  ASSERT_EQ(env.count("STRATA_LAUNCH_TEST_VAR"), 1u);
  EXPECT_EQ(env.at("STRATA_LAUNCH_TEST_VAR"), "a=b");
}

// --- small helpers ------------------------------------------------------------------

TEST(LaunchTest, RecordRankErrorWritesTheErrorFile) {
  TempDir dir;
  const auto file = dir.path() / "rank-0.err";
  {
    ScopedEnv var("STRATA_ERROR_FILE", file.c_str());
    EXPECT_EQ(strata::rank_error_file(), file.string());
    strata::record_rank_error("loss is NaN at step 7");
    strata::record_rank_error("connection closed while unwinding");  // first error wins
  }
  // The message, then the failure time the launcher orders failures by.
  const std::string text = read_file(file);
  EXPECT_EQ(text.rfind("loss is NaN at step 7\ntime_ns=", 0), 0u) << text;
  const long long ns = std::stoll(text.substr(text.find("time_ns=") + 8));
  const long long now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(now - ns, 60LL * 1000000000LL) << "a time_ns from the last minute";
  EXPECT_GE(now, ns);
  ::unsetenv("STRATA_ERROR_FILE");
  EXPECT_EQ(strata::rank_error_file(), "");
  strata::record_rank_error("goes nowhere");  // must not throw
  ScopedEnv unwritable("STRATA_ERROR_FILE", "/nonexistent-dir/rank.err");
  strata::record_rank_error("cannot be written");  // must not throw either
}

TEST(LaunchTest, ConfigureThreadsUsesRequestThenEnvironmentThenCores) {
  const int before = at::get_num_threads();
  strata::configure_threads(1, 4);
  EXPECT_EQ(at::get_num_threads(), 1);
  {
    ScopedEnv var("STRATA_THREADS_PER_RANK", "2");
    strata::configure_threads(0, 8);
    EXPECT_EQ(at::get_num_threads(), 2);
    strata::configure_threads(1, 8);  // an explicit request wins
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  ::unsetenv("STRATA_THREADS_PER_RANK");
  strata::configure_threads(0, 100000);  // more ranks than cores: at least 1
  EXPECT_EQ(at::get_num_threads(), 1);
  {
    ScopedEnv var("STRATA_THREADS_PER_RANK", "many");
    EXPECT_THROW(strata::configure_threads(0, 1), c10::Error);
  }
  at::set_num_threads(before);
}

// --- launch_ranks ---------------------------------------------------------------------

std::vector<std::string> sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

TEST(LaunchTest, AllRanksSucceedReturnsZeroWithTheTorchrunEnvironment) {
  TempDir dir;
  LaunchOptions opts;
  opts.nproc = 3;
  opts.threads_per_rank = 2;
  // Variables from the caller's environment that must not reach the ranks.
  ScopedEnv stale_port("MASTER_PORT", "1234");
  ScopedEnv stale_agent("TORCHELASTIC_USE_AGENT_STORE", "True");
  const int rc = strata::launch_ranks(
      sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $OMP_NUM_THREADS "
         "$STRATA_THREADS_PER_RANK port=${MASTER_PORT-unset} agent=${TORCHELASTIC_USE_AGENT_STORE-unset}\" > '" +
         dir.path().string() + "/rank-'\"$RANK\".txt; "
         "echo \"$STRATA_STORE_FILE\" > '" + dir.path().string() + "/store-'\"$RANK\".txt; "
         "echo \"$STRATA_ERROR_FILE\" > '" + dir.path().string() + "/err-'\"$RANK\".txt"),
      opts);
  EXPECT_EQ(rc, 0);
  std::string store;
  for (int r = 0; r < 3; ++r) {
    // One machine: no port at all; the ranks meet in a file.
    EXPECT_EQ(read_file(dir.path() / ("rank-" + std::to_string(r) + ".txt")),
              std::to_string(r) + " 3 " + std::to_string(r) + " 3 127.0.0.1 2 2 port=unset agent=unset\n");
    const auto s = read_file(dir.path() / ("store-" + std::to_string(r) + ".txt"));
    if (r == 0) store = s;
    EXPECT_EQ(s, store);  // every rank meets in the same store
    EXPECT_EQ(fs::path(s.substr(0, s.size() - 1)).filename(), "store");
    std::string err = read_file(dir.path() / ("err-" + std::to_string(r) + ".txt"));
    if (!err.empty()) err.pop_back();
    EXPECT_EQ(fs::path(err).filename(), "rank-" + std::to_string(r) + ".err");
    EXPECT_EQ(fs::path(err).parent_path(), fs::path(store.substr(0, store.size() - 1)).parent_path());
    EXPECT_FALSE(fs::exists(fs::path(err).parent_path())) << "launcher left its temp dir behind";
  }
}

TEST(LaunchTest, SecondNodeNumbersItsRanksAfterTheFirstAndMeetsOverTcp) {
  TempDir dir;
  LaunchOptions opts;
  opts.nproc = 2;
  opts.nnodes = 3;
  opts.node_rank = 1;
  opts.master_addr = "192.0.2.1";
  opts.master_port = 29600;
  const int rc = strata::launch_ranks(
      sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
         "store=${STRATA_STORE_FILE-unset}\" > '" + dir.path().string() + "/rank-'\"$RANK\".txt"),
      opts);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(read_file(dir.path() / "rank-2.txt"), "2 6 0 2 192.0.2.1 29600 store=unset\n");
  EXPECT_EQ(read_file(dir.path() / "rank-3.txt"), "3 6 1 2 192.0.2.1 29600 store=unset\n");
  EXPECT_FALSE(fs::exists(dir.path() / "rank-0.txt"));

  // A failure is named by the global rank.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(strata::launch_ranks(sh("if [ \"$LOCAL_RANK\" = 1 ]; then exit 4; fi"), opts), 1);
  EXPECT_CONTAINS(::testing::internal::GetCapturedStderr(), "strata: rank 3 failed (exit code 4)");
}

TEST(LaunchTest, MultiNodeOptionsAreCheckedNamingTheValues) {
  LaunchOptions opts;
  opts.nnodes = 2;
  opts.node_rank = 2;
  opts.master_port = 29600;
  EXPECT_CONTAINS(what_of([&] { strata::launch_ranks(sh("true"), opts); }),
                  "node_rank 2 is outside [0, nnodes 2)");
  opts.node_rank = 0;
  opts.master_port = 0;
  EXPECT_CONTAINS(what_of([&] { strata::launch_ranks(sh("true"), opts); }),
                  "master_port 0 must be in [1, 65535] with nnodes 2");
  opts.nnodes = 0;
  EXPECT_CONTAINS(what_of([&] { strata::launch_ranks(sh("true"), opts); }), "nnodes 0 must be >= 1");
}

TEST(LaunchTest, FailingRankStopsTheOthersAndIsNamedWithItsError) {
  LaunchOptions opts;
  opts.nproc = 3;
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  // `exec sleep`: the signal must reach the sleeping process, not just its shell.
  const int rc = strata::launch_ranks(
      sh("if [ \"$RANK\" = 1 ]; then echo 'boom from rank 1' > \"$STRATA_ERROR_FILE\"; exit 3; fi; "
         "exec sleep 60"),
      opts);
  const auto elapsed = Clock::now() - start;
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(rc, 0);
  EXPECT_LT(elapsed, std::chrono::seconds(20));  // correctness bound: the sleepers were stopped
  EXPECT_CONTAINS(err, "strata: rank 1 failed (exit code 3): boom from rank 1\n");
  // Ranks the launcher stopped are not failures.
  EXPECT_EQ(err.find("rank 0 failed"), std::string::npos) << err;
  EXPECT_EQ(err.find("rank 2 failed"), std::string::npos) << err;
}

TEST(LaunchTest, RanksFailingAlikeShareOneLine) {
  // A collective error every rank raises (a checkpoint no rank could write):
  // one line naming the ranks, not one line each. Ranks 0 and 1 ignore the
  // launcher's SIGTERM, so both fail whichever is first.
  LaunchOptions opts;
  opts.nproc = 3;
  ::testing::internal::CaptureStderr();
  const int rc = strata::launch_ranks(
      sh("if [ \"$RANK\" = 2 ]; then exit 0; fi; trap '' TERM; echo 'disk full' > \"$STRATA_ERROR_FILE\"; "
         "sleep 0.3; exit 1"),
      opts);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  const auto first = err.find("failed (exit code 1): disk full\n");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("disk full", first + 32), std::string::npos) << "one line per rank:\n" << err;
  const auto line = err.substr(err.rfind("strata: ", first), first - err.rfind("strata: ", first));
  EXPECT_TRUE(line == "strata: ranks 0, 1 " || line == "strata: ranks 1, 0 ") << err;
}

TEST(LaunchTest, EchoFailuresAreReportedAfterTheRootCause) {
  // Rank 0 ignores SIGTERM and then fails on its own, like a rank whose
  // collective errors out because its peer died: it is a failure too, but it
  // failed later than rank 1, so rank 1 is named first.
  LaunchOptions opts;
  opts.nproc = 2;
  ::testing::internal::CaptureStderr();
  const int rc = strata::launch_ranks(
      // Rank 1 fails only once rank 0 has installed its trap (a marker file),
      // or SIGTERM could reach rank 0 first under load; rank 0 fails only
      // once rank 1's error is written (a second marker): the order is the
      // scripts', whatever the load. Each writes its failure time as
      // record_rank_error does (time_ns=...): the files' mtimes tick every
      // few milliseconds and could not order two failures this close.
      sh("dir=\"$(dirname \"$STRATA_ERROR_FILE\")\"; "
         "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$dir/trap-set\" ]; do sleep 0.01; done; "
         "printf 'root cause\\ntime_ns=%s\\n' $(date +%s%N) > \"$STRATA_ERROR_FILE\"; touch \"$dir/root-written\"; exit 3; fi; "
         "trap '' TERM; touch \"$dir/trap-set\"; while [ ! -e \"$dir/root-written\" ]; do sleep 0.01; done; "
         "printf 'peer went away\\ntime_ns=%s\\n' $(date +%s%N) > \"$STRATA_ERROR_FILE\"; exit 4"),
      opts);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  const auto root = err.find("strata: rank 1 failed (exit code 3): root cause");
  const auto echo = err.find("strata: rank 0 failed (exit code 4): peer went away");
  ASSERT_NE(root, std::string::npos) << err;
  ASSERT_NE(echo, std::string::npos) << err;
  EXPECT_LT(root, echo) << err;
}

TEST(LaunchTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  LaunchOptions opts;
  opts.nproc = 2;
  opts.grace = std::chrono::seconds(1);
  // Rank 0 fails only once rank 1 ignores SIGTERM (the marker file says so);
  // otherwise the launcher's SIGTERM could arrive before the trap is set.
  const auto marker = std::filesystem::temp_directory_path() /
                      ("strata-launch-trap-" + std::to_string(::getpid()));
  std::filesystem::remove(marker);
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const int rc = strata::launch_ranks(
      sh("if [ \"$RANK\" = 0 ]; then while [ ! -e " + marker.string() +
         " ]; do sleep 0.01; done; exit 2; fi; trap '' TERM; touch " + marker.string() + "; exec sleep 60"),
      opts);
  std::filesystem::remove(marker);
  const auto elapsed = Clock::now() - start;
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_GE(elapsed, milliseconds(900));  // SIGTERM was ignored: it waited for the grace period
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  EXPECT_CONTAINS(err, "strata: rank 0 failed (exit code 2)");
  EXPECT_EQ(err.find("rank 1 failed"), std::string::npos) << "SIGKILLed by the launcher: " << err;
}

TEST(LaunchTest, FailureWithoutErrorFileOrBySignalIsDescribed) {
  LaunchOptions opts;
  opts.nproc = 2;
  ::testing::internal::CaptureStderr();
  int rc = strata::launch_ranks(sh("if [ \"$RANK\" = 0 ]; then exit 5; fi; exec sleep 60"), opts);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_CONTAINS(err, "strata: rank 0 failed (exit code 5): no error message");

  ::testing::internal::CaptureStderr();
  rc = strata::launch_ranks(sh("if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; exec sleep 60"), opts);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_CONTAINS(err, "strata: rank 1 failed (killed by signal 9): no error message");
}

TEST(LaunchTest, ExecFailureIsReportedThroughTheErrorFile) {
  LaunchOptions opts;
  opts.nproc = 1;
  ::testing::internal::CaptureStderr();
  const int rc = strata::launch_ranks({"/nonexistent/strata-binary", "--flag"}, opts);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_CONTAINS(err, "strata: rank 0 failed (exit code 127): cannot execute /nonexistent/strata-binary");
}

TEST(LaunchTest, SigtermToLauncherIsForwardedToEveryRank) {
  TempDir dir;
  LaunchOptions opts;
  opts.nproc = 2;
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);

  std::atomic<int> rc{-1};
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  std::thread launcher([&] {
    rc = strata::launch_ranks(
        sh("touch '" + dir.path().string() + "/started-'$RANK; exec sleep 60"), opts);
  });
  // The ranks exist only after the launcher installed its handler, so once
  // both have started, SIGTERM goes to the handler and not the default action.
  const auto give_up = Clock::now() + std::chrono::seconds(15);
  while (!(fs::exists(dir.path() / "started-0") && fs::exists(dir.path() / "started-1")) &&
         Clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(fs::exists(dir.path() / "started-1") && fs::exists(dir.path() / "started-0"));
  ::kill(::getpid(), SIGTERM);
  launcher.join();
  const std::string err = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(rc.load(), 128 + SIGTERM);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(err.find("failed"), std::string::npos) << "stopped ranks reported as failures: " << err;
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "launcher did not restore the SIGTERM handler";
}

}  // namespace
