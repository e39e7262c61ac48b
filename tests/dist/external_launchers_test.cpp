// external_launchers_test - strata-gpt ranks started by someone else, the way
// torchrun, srun and mpirun start them: plain processes with only that
// launcher's variables. Each world must train to exactly the losses of the
// same configuration self-launched with --nproc.
//
// torchrun is reproduced rather than called (Debian's fails on Python 3.11
// before launching anything): python3-torch serves the agent's c10d TCPStore
// on MASTER_PORT, as torchrun's default (static) rendezvous does, and the
// ranks get the environment torch 1.13's LocalElasticAgent gives its workers.
#include "tests/dist/process.h"
#include "tests/dist/run_binary.h"
#include "core/net.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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

constexpr const char* kPython = "/usr/bin/python3";  // Debian's, with python3-torch
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

std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

TEST(TorchrunTest, RanksJoinTheAgentsStoreAndTrainLikeASelfLaunchedRun) {
  ASSERT_FALSE(reference_losses().empty());
  // The agent: a real c10d TCPStore server from python3-torch on a port it
  // picks, with a key of its own and one under strata's unprefixed key name
  // (a rank reading it would see WORLD_SIZE 99 and fail). It exits when the
  // test does (parent gone) or after 120 s.
  const fs::path port_file = scratch() / "agent.port";
  const std::string script =
      "import datetime, os, sys, time\n"
      "import torch.distributed as dist\n"
      "parent = os.getppid()\n"
      "store = dist.TCPStore('127.0.0.1', 0, 1, True, datetime.timedelta(seconds=60), wait_for_workers=False)\n"
      "store.set('strata/world_size', '99')\n"
      "store.set('run-42/agent', 'the agent\\'s own key')\n"
      "with open(sys.argv[1] + '.tmp', 'w') as f: f.write(str(store.port))\n"
      "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
      "deadline = time.time() + 120\n"
      "while os.getppid() == parent and time.time() < deadline: time.sleep(0.2)\n";
  ASSERT_TRUE(fs::exists(kPython)) << kPython << " is missing: scripts/setup installs python3-torch";
  Process agent({kPython, "-c", script, port_file.string()}, base_environment(), scratch() / "agent.log");
  ASSERT_TRUE(wait_until([&] { return fs::exists(port_file) || agent.wait_for(0ms).has_value(); }, 60s))
      << "the python agent did not start within 60 s:\n" << agent.output();
  ASSERT_TRUE(fs::exists(port_file)) << "python3-torch's TCPStore did not start (scripts/setup installs it):\n"
                                     << agent.output();
  const std::string port = strata::testing::read_text(port_file);

  const fs::path out = run_world("torchrun", [&](int rank) -> std::map<std::string, std::string> {
    // What torch 1.13's LocalElasticAgent._start_workers sets (one node).
    return {{"LOCAL_RANK", std::to_string(rank)},
            {"RANK", std::to_string(rank)},
            {"GROUP_RANK", "0"},
            {"ROLE_RANK", std::to_string(rank)},
            {"ROLE_NAME", "default"},
            {"LOCAL_WORLD_SIZE", std::to_string(kWorld)},
            {"WORLD_SIZE", std::to_string(kWorld)},
            {"GROUP_WORLD_SIZE", "1"},
            {"ROLE_WORLD_SIZE", std::to_string(kWorld)},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", port},
            {"TORCHELASTIC_RESTART_COUNT", "0"},
            {"TORCHELASTIC_MAX_RESTARTS", "0"},
            {"TORCHELASTIC_RUN_ID", "run-42"},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {"NCCL_ASYNC_ERROR_HANDLING", "1"},
            {"OMP_NUM_THREADS", "1"}};
  });
  EXPECT_EQ(losses_of(out / "metrics.csv"), reference_losses());

  // The ranks met under torch's attempt prefix and left the agent's keys alone.
  c10d::TCPStoreOptions client;
  client.port = static_cast<uint16_t>(std::stoi(port));
  client.waitWorkers = false;
  client.timeout = 10s;
  c10d::TCPStore store("127.0.0.1", client);
  EXPECT_EQ(text(store.get("/worker/attempt_0/strata/world_size")), std::to_string(kWorld));
  EXPECT_EQ(text(store.get("strata/world_size")), "99");
  EXPECT_EQ(text(store.get("run-42/agent")), "the agent's own key");
  EXPECT_TRUE(agent.running()) << "the agent's store must outlive the ranks";
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
