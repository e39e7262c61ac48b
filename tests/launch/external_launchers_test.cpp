// external_launchers_test - strata-gpt ranks started by someone else, the way
// torchrun, srun and mpirun start them: plain processes with only that
// launcher's variables. Each world must train to exactly the losses of the
// same configuration self-launched with --nproc.
//
// torchrun is the real one, from the Python environment scripts/setup made
// (STRATA_PYTHON, compiled in), with its static and c10d rendezvous.
#include "tests/process.h"
#include "tests/run_binary.h"
#include "strata/core/net.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using strata::testing::base_environment;
using strata::testing::losses_of;
using strata::testing::Process;
using strata::testing::run_gpt_binary;
using strata::testing::wait_until;
using namespace std::chrono_literals;

constexpr const char* kPython = STRATA_PYTHON;  // scripts/setup's venv, with torch
constexpr int kWorld = 2;

fs::path scratch() {
  static const strata::testing::ScratchDir dir("strata-extlaunch");
  return dir.path();
}

/// The training flags every run here shares (ddp, a few logged steps).
std::vector<std::string> train_flags(const fs::path& out) {
  return {"--preset",          "gpt-nano", "--data",          "addition:2", "--strategy", "ddp",
          "--batch-size",      "2",        "--max-steps",     "6",          "--log-every-n-steps", "1",
          "--threads-per-rank", "1",       "--limit-val-batches", "1",      "--progress-bar", "false",
          "--comm-timeout",    "30",       "--output-dir",    out.string()};
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

/// The self-launched reference (strata-gpt --nproc 2), trained once per test binary.
const std::vector<std::string>& reference_losses() {
  static const std::vector<std::string> losses = [] {
    const fs::path out = scratch() / "reference";
    auto flags = train_flags(out);
    flags.insert(flags.end(), {"--nproc", std::to_string(kWorld)});
    const auto run = run_gpt_binary(join(flags));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return losses_of(out / "metrics.csv");
  }();
  return losses;
}

/// Starts one strata-gpt per rank with `env_of(rank)` (plus PATH) and no
/// --nproc, waits (bounded) and checks they all succeed; returns rank 0's
/// output directory.
fs::path run_world(const std::string& tag, const std::function<std::map<std::string, std::string>(int)>& env_of) {
  const fs::path out = scratch() / tag;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> argv = {STRATA_GPT_BINARY};
    for (const auto& f : train_flags(out)) argv.push_back(f);
    auto env = base_environment();
    for (const auto& [k, v] : env_of(rank)) env.push_back(k + "=" + v);
    ranks.push_back(std::make_unique<Process>(argv, env, scratch() / (tag + "-rank" + std::to_string(rank) + ".log")));
    EXPECT_TRUE(ranks.back()->started());
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto code = ranks[rank]->wait_for(90s);
    EXPECT_TRUE(code.has_value()) << tag << " rank " << rank << " still running after 90 s:\n" << ranks[rank]->output();
    EXPECT_EQ(code.value_or(-1), 0) << tag << " rank " << rank << ":\n" << ranks[rank]->output();
  }
  return out;
}

/// Runs the venv's real torchrun over strata-gpt (--no-python) with
/// `rendezvous` flags (then `extra` strata-gpt flags and `env` variables);
/// returns its output directory after checking it exited 0, and its output.
fs::path run_torchrun(const std::string& tag, const std::vector<std::string>& rendezvous,
                      const std::vector<std::string>& extra = {}, const std::vector<std::string>& env = {},
                      std::string* output = nullptr) {
  const fs::path out = scratch() / tag;
  std::vector<std::string> argv = {kPython, "-m", "torch.distributed.run", "--nproc-per-node", std::to_string(kWorld)};
  argv.insert(argv.end(), rendezvous.begin(), rendezvous.end());
  argv.insert(argv.end(), {"--no-python", STRATA_GPT_BINARY});
  for (const auto& f : train_flags(out)) argv.push_back(f);
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto environment = base_environment();
  environment.insert(environment.end(), env.begin(), env.end());
  Process torchrun(argv, environment, scratch() / (tag + ".log"));
  EXPECT_TRUE(torchrun.started());
  const auto code = torchrun.wait_for(120s);
  EXPECT_TRUE(code.has_value()) << tag << ": torchrun still running after 120 s:\n" << torchrun.output();
  EXPECT_EQ(code.value_or(-1), 0) << tag << ":\n" << torchrun.output();
  if (output != nullptr) *output = torchrun.output();
  return out;
}

bool have_torchrun() {
  static const bool ok = std::string(kPython).size() > 0 &&
                         strata::testing::run_command(std::string(kPython) + " -c 'import torch.distributed.run'")
                                 .exit_code == 0;
  return ok;
}

// torchrun's default static rendezvous: its agent hosts a TCPStore on
// MASTER_PORT and tells the workers (TORCHELASTIC_USE_AGENT_STORE) to join it
// under its attempt prefix instead of hosting their own.
TEST(TorchrunTest, StaticRendezvousTrainsLikeASelfLaunchedRun) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python with torch (STRATA_PYTHON='" << kPython << "'): run scripts/setup";
  ASSERT_FALSE(reference_losses().empty());
  const std::string port = std::to_string(strata::find_free_port("127.0.0.1"));
  const fs::path out =
      run_torchrun("torchrun-static", {"--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", port});
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());
}

// The c10d rendezvous (what multi-node jobs use): the agents meet in a
// TCPStore at --rdzv-endpoint and the workers get the agent's store.
TEST(TorchrunTest, C10dRendezvousTrainsLikeASelfLaunchedRun) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python with torch (STRATA_PYTHON='" << kPython << "'): run scripts/setup";
  ASSERT_FALSE(reference_losses().empty());
  const std::string port = std::to_string(strata::find_free_port("127.0.0.1"));
  const fs::path out = run_torchrun("torchrun-c10d", {"--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                                      "127.0.0.1:" + port, "--rdzv-id", "strata-test"});
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());
}

// A job torchrun restarts (--max-restarts) after one of its workers is
// SIGKILLed at step 5: the same strata-gpt command, with --resume auto,
// resumes every worker from the newest complete checkpoint and ends with the
// uninterrupted run's losses, bit for bit (an exact resume).
TEST(TorchrunTest, MaxRestartsWithResumeAutoEndsWithTheUninterruptedLosses) {
  if (!have_torchrun()) GTEST_SKIP() << "no Python with torch (STRATA_PYTHON='" << kPython << "'): run scripts/setup";
  ASSERT_FALSE(reference_losses().empty());
  const std::string port = std::to_string(strata::find_free_port("127.0.0.1"));
  const fs::path marker = scratch() / "torchrun-restart-killed-once";
  std::string output;
  const fs::path out = run_torchrun(
      "torchrun-restart", {"--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", port, "--max-restarts", "2"},
      {"--checkpoint-every", "2", "--resume", "auto"},
      {"STRATA_TEST_KILL_AT_STEP=5", "STRATA_TEST_KILL_RANK=1", "STRATA_TEST_KILL_ONCE=" + marker.string()}, &output);
  EXPECT_TRUE(fs::exists(marker)) << "no worker was killed:\n" << output;
  EXPECT_NE(output.find("--resume auto: no complete checkpoint"), std::string::npos) << output;
  EXPECT_NE(output.find("--resume auto: resuming from '" + (out / "checkpoints").string() + "/step-"),
            std::string::npos)
      << output;
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());
}

TEST(SlurmTest, SrunStyleRanksTrainLikeASelfLaunchedRun) {
  ASSERT_FALSE(reference_losses().empty());
  const std::string port = std::to_string(strata::find_free_port("127.0.0.1"));
  const fs::path out = run_world("slurm", [&](int rank) -> std::map<std::string, std::string> {
    // What srun sets for a 1-node, 2-task step (MASTER_* come from the job script).
    return {{"SLURM_JOB_ID", "4242"},
            {"SLURM_STEP_ID", "0"},
            {"SLURM_NNODES", "1"},
            {"SLURM_NODEID", "0"},
            {"SLURM_NTASKS", std::to_string(kWorld)},
            {"SLURM_NPROCS", std::to_string(kWorld)},
            {"SLURM_TASKS_PER_NODE", std::to_string(kWorld)},
            {"SLURM_PROCID", std::to_string(rank)},
            {"SLURM_LOCALID", std::to_string(rank)},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", port}};
  });
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());
}

TEST(OpenMpiTest, MpirunStyleRanksTrainLikeASelfLaunchedRun) {
  ASSERT_FALSE(reference_losses().empty());
  const std::string port = std::to_string(strata::find_free_port("127.0.0.1"));
  const fs::path out = run_world("ompi", [&](int rank) -> std::map<std::string, std::string> {
    // What Open MPI's mpirun sets (MASTER_* passed with -x).
    return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
            {"OMPI_COMM_WORLD_SIZE", std::to_string(kWorld)},
            {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(kWorld)},
            {"OMPI_COMM_WORLD_NODE_RANK", "0"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", port}};
  });
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());
}

}  // namespace
