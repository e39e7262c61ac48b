// Launch: environment parsing, spawning and stopping ranks; TcpStore, the
// rendezvous store the ranks meet in.
#include "tests/error_text.h"
#include "launch/environment.h"
#include "launch/launcher.h"
#include "strategies/tcp_store.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using strata::dist_env_from;
using strata::DistEnv;
using strata::LaunchOptions;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using strata::testing::what_of;

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)

/// A fresh directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "strata-launch-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Sets an environment variable for the scope, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

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

TEST(DistEnvTest, CurrentEnvironmentReflectsTheProcess) {
  ScopedEnv var("STRATA_LAUNCH_TEST_VAR", "a=b");
  const auto env = strata::current_environment();
  ASSERT_EQ(env.count("STRATA_LAUNCH_TEST_VAR"), 1u);
  EXPECT_EQ(env.at("STRATA_LAUNCH_TEST_VAR"), "a=b");
}

// --- small helpers ------------------------------------------------------------------

TEST(LaunchTest, FindFreePortReturnsABindablePort) {
  const int port = strata::find_free_port("127.0.0.1");
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  // Binding it (as the rendezvous server will) must work.
  strata::TcpStore server("127.0.0.1", port, /*is_server=*/true, std::chrono::seconds(5));
  EXPECT_EQ(server.port(), port);
  EXPECT_THROW(strata::find_free_port("no-such-host.invalid"), c10::Error);
}

TEST(LaunchTest, RecordRankErrorWritesTheErrorFile) {
  TempDir dir;
  const auto file = dir.path() / "rank-0.err";
  {
    ScopedEnv var("STRATA_ERROR_FILE", file.c_str());
    EXPECT_EQ(strata::rank_error_file(), file.string());
    strata::record_rank_error("loss is NaN at step 7");
    strata::record_rank_error("connection closed while unwinding");  // first error wins
  }
  EXPECT_EQ(read_file(file), "loss is NaN at step 7\n");
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
  const int rc = strata::launch_ranks(
      sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $OMP_NUM_THREADS "
         "$STRATA_THREADS_PER_RANK\" > '" + dir.path().string() + "/rank-'\"$RANK\".txt; "
         "echo \"$MASTER_PORT\" > '" + dir.path().string() + "/port-'\"$RANK\".txt; "
         "echo \"$STRATA_ERROR_FILE\" > '" + dir.path().string() + "/err-'\"$RANK\".txt"),
      opts);
  EXPECT_EQ(rc, 0);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(read_file(dir.path() / ("rank-" + std::to_string(r) + ".txt")),
              std::to_string(r) + " 3 " + std::to_string(r) + " 3 127.0.0.1 2 2\n");
    const auto p = read_file(dir.path() / ("port-" + std::to_string(r) + ".txt"));
    if (r == 0) port = p;
    EXPECT_EQ(p, port);  // every rank meets at the same port
    EXPECT_GT(std::atoi(p.c_str()), 0);
    std::string err = read_file(dir.path() / ("err-" + std::to_string(r) + ".txt"));
    if (!err.empty()) err.pop_back();
    EXPECT_EQ(fs::path(err).filename(), "rank-" + std::to_string(r) + ".err");
    EXPECT_FALSE(fs::exists(fs::path(err).parent_path())) << "launcher left its temp dir behind";
  }
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

TEST(LaunchTest, EchoFailuresAreReportedAfterTheRootCause) {
  // Rank 0 ignores SIGTERM and then fails on its own, like a rank whose
  // collective errors out because its peer died: it is a failure too, but it
  // failed later than rank 1, so rank 1 is named first.
  LaunchOptions opts;
  opts.nproc = 2;
  ::testing::internal::CaptureStderr();
  const int rc = strata::launch_ranks(
      // Rank 1 fails only once rank 0 has installed its trap (a marker file),
      // or SIGTERM could reach rank 0 first under load.
      sh("marker=\"$(dirname \"$STRATA_ERROR_FILE\")/trap-set\"; "
         "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$marker\" ]; do sleep 0.01; done; "
         "echo 'root cause' > \"$STRATA_ERROR_FILE\"; exit 3; fi; "
         "trap '' TERM; touch \"$marker\"; sleep 0.3; echo 'peer went away' > \"$STRATA_ERROR_FILE\"; exit 4"),
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

// --- TcpStore ---------------------------------------------------------------------------

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TcpStoreTest, ServerAndClientShareKeys) {
  strata::TcpStore server("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(5));
  ASSERT_GT(server.port(), 0);
  strata::TcpStore client("127.0.0.1", server.port(), /*is_server=*/false, std::chrono::seconds(5));
  EXPECT_TRUE(server.is_server());
  EXPECT_FALSE(client.is_server());

  server.set("alpha", bytes("one"));
  EXPECT_EQ(client.get("alpha"), bytes("one"));
  client.set("alpha", bytes("two"));
  EXPECT_EQ(server.get("alpha"), bytes("two"));
  client.set("empty", {});
  EXPECT_EQ(server.get("empty"), std::vector<uint8_t>{});

  EXPECT_EQ(client.add("counter", 5), 5);
  EXPECT_EQ(server.add("counter", 3), 8);
  EXPECT_EQ(client.add("counter", -10), -2);
  EXPECT_EQ(server.get("counter"), bytes("-2"));

  EXPECT_TRUE(client.check({"alpha", "counter"}));
  EXPECT_FALSE(client.check({"alpha", "missing"}));
  EXPECT_EQ(client.getNumKeys(), 3);
  EXPECT_TRUE(server.deleteKey("alpha"));
  EXPECT_FALSE(client.deleteKey("alpha"));
  EXPECT_EQ(client.getNumKeys(), 2);

  // compareSet: absent + empty expectation sets; a wrong expectation does not.
  EXPECT_EQ(client.compareSet("cas", {}, bytes("v1")), bytes("v1"));
  EXPECT_EQ(server.compareSet("cas", bytes("wrong"), bytes("v2")), bytes("v1"));
  EXPECT_EQ(server.compareSet("cas", bytes("v1"), bytes("v2")), bytes("v2"));
  EXPECT_EQ(client.get("cas"), bytes("v2"));

  client.set("text", bytes("abc"));
  EXPECT_THROW(client.add("text", 1), c10::Error);
  EXPECT_EQ(client.add("counter", 2), 0);  // the connection still works after an error reply
}

TEST(TcpStoreTest, GetAndWaitBlockUntilAnotherRankSets) {
  strata::TcpStore server("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(10));
  strata::TcpStore client("127.0.0.1", server.port(), /*is_server=*/false, std::chrono::seconds(10));
  std::vector<uint8_t> got;
  std::thread waiter([&] {
    client.wait({"late", "later"});
    got = client.get("later");
  });
  // Whether the waiter is already blocked or not, it must see both keys.
  server.set("late", bytes("1"));
  server.set("later", bytes("2"));
  waiter.join();
  EXPECT_EQ(got, bytes("2"));
}

TEST(TcpStoreTest, WaitAndGetTimeOutNamingTheKeys) {
  strata::TcpStore server("127.0.0.1", 0, /*is_server=*/true, milliseconds(300));
  strata::TcpStore client("127.0.0.1", server.port(), /*is_server=*/false, milliseconds(300));
  auto start = Clock::now();
  auto msg = what_of([&] { client.wait({"never"}, milliseconds(200)); });
  auto elapsed = Clock::now() - start;
  EXPECT_CONTAINS(msg, "[never]");
  EXPECT_CONTAINS(msg, "0.2 s");
  EXPECT_GE(elapsed, milliseconds(150));
  EXPECT_LT(elapsed, std::chrono::seconds(5));

  start = Clock::now();
  msg = what_of([&] { client.get("missing"); });  // the store's own timeout, 0.3 s
  EXPECT_CONTAINS(msg, "[missing]");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  client.set("after", bytes("ok"));  // a timed-out request leaves the connection usable
  EXPECT_EQ(server.get("after"), bytes("ok"));
}

TEST(TcpStoreTest, PortInUseIsAnErrorNamingPortAndHost) {
  strata::TcpStore first("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(5));
  const int port = first.port();
  const auto msg = what_of(
      [&] { strata::TcpStore second("127.0.0.1", port, /*is_server=*/true, std::chrono::seconds(5)); });
  EXPECT_CONTAINS(msg, "MASTER_PORT " + std::to_string(port) + " on 127.0.0.1 is already in use");
}

TEST(TcpStoreTest, UnreachableServerIsAnErrorAfterTheTimeout) {
  const int port = strata::find_free_port("127.0.0.1");  // nobody listens there
  const auto start = Clock::now();
  const auto msg = what_of(
      [&] { strata::TcpStore client("127.0.0.1", port, /*is_server=*/false, milliseconds(500)); });
  const auto elapsed = Clock::now() - start;
  EXPECT_CONTAINS(msg, "could not reach MASTER_ADDR 127.0.0.1:" + std::to_string(port) + " within 0.5 s");
  EXPECT_GE(elapsed, milliseconds(400));  // it retried rather than giving up at once
  EXPECT_LT(elapsed, std::chrono::seconds(5));
}

TEST(TcpStoreTest, ServerListensOnTheGivenAddressOnly) {
  // 127.0.0.2 is this machine too, but not the address the server bound.
  strata::TcpStore server("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(5));
  const auto msg = what_of([&] {
    strata::TcpStore client("127.0.0.2", server.port(), /*is_server=*/false, milliseconds(300));
  });
  EXPECT_CONTAINS(msg, "could not reach MASTER_ADDR 127.0.0.2:");
}

TEST(TcpStoreTest, DestroyingTheServerWakesBlockedClients) {
  auto server = std::make_unique<strata::TcpStore>("127.0.0.1", 0, true, std::chrono::seconds(30));
  strata::TcpStore client("127.0.0.1", server->port(), /*is_server=*/false, std::chrono::seconds(30));
  std::string msg;
  std::thread waiter([&] { msg = what_of([&] { client.wait({"never"}); }); });
  const auto start = Clock::now();
  // Whether the wait has reached the server yet or not, destroying it must not
  // hang, and the client must get an error instead of waiting 30 s.
  server.reset();
  waiter.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_CONTAINS(msg, "TcpStore::wait");
  EXPECT_CONTAINS(msg, "MASTER_ADDR 127.0.0.1:");
}

}  // namespace
