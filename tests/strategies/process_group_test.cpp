// process_group_test - rendezvous through each store strata uses, with ranks
// as threads in this process: c10d's FileStore (one machine, strata's
// launcher), c10d's TCPStore hosted by rank 0 (SLURM, mpirun, several nodes),
// and torchrun's agent store (every rank a client, keys under a prefix).
// Errors name the store, the rank and the world size; nothing hangs.
#include "strata/core/cuda_support.h"
#include "strata/core/net.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/process_group.h"
#include "tests/error_text.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {
using strata::testing::TempDir;

namespace fs = std::filesystem;
using strata::Comm;
using strata::ProcessGroupOptions;
using strata::testing::what_of;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A c10d TCPStore server on 127.0.0.1 and a free port, like torchrun's agent
/// (or anything else that holds the port).
c10::intrusive_ptr<c10d::TCPStore> serve_store(int expected_clients) {
  c10d::TCPStoreOptions o;
  o.port = 0;  // any free port; read back with getPort()
  o.isServer = true;
  o.numWorkers = static_cast<size_t>(expected_clients);
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(10);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

/// Runs `world_size` ranks as threads, each creating its process group from
/// `options_for(rank)` and all-reducing rank+1; returns each rank's error
/// ("<no exception>" when it succeeded) and checks the sums of the ones that did.
std::vector<std::string> all_reduce_in_threads(int world_size,
                                               const std::function<ProcessGroupOptions(int)>& options_for) {
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world_size; ++rank) {
    ranks.emplace_back([&, rank] {
      errors[rank] = what_of([&] {
        Comm comm(strata::create_process_group(options_for(rank)));
        auto t = torch::full({3}, static_cast<float>(rank + 1));
        comm.all_reduce(t);
        const float sum = world_size * (world_size + 1) / 2.0f;
        EXPECT_TRUE(t.equal(torch::full({3}, sum))) << "rank " << rank << ": " << t;
      });
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(ProcessGroupTest, RanksOnOneMachineMeetInAFileStoreWithoutAPort) {
  TempDir dir;
  const auto file = (dir.path() / "store").string();
  const auto errors = all_reduce_in_threads(3, [&](int rank) {
    // master_port 1 would be refused if anything tried TCP: the file is all they use.
    return ProcessGroupOptions(rank, 3).store_file(file).master_port(1).timeout(std::chrono::seconds(10));
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "<no exception>") << "rank " << r;
}

TEST(ProcessGroupTest, RankZeroHostsTheTcpStoreTheOthersJoin) {
  const int port = strata::find_free_port("127.0.0.1");
  const auto errors = all_reduce_in_threads(2, [&](int rank) {
    return ProcessGroupOptions(rank, 2).master_port(port).timeout(std::chrono::seconds(10));
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "<no exception>") << "rank " << r;
}

TEST(ProcessGroupTest, UnderTorchrunsAgentStoreEveryRankIsAClientUnderTheAttemptPrefix) {
  // The agent holds the port: had rank 0 tried to host a store there, it would
  // fail with "could not host". The agent's own keys must not be touched, and a
  // key with strata's unprefixed name must not be read.
  auto agent = serve_store(2);
  agent->set("strata/world_size", bytes("99"));
  agent->set("job-7/rdzv", bytes("agent's"));
  auto options = [&](int world_size, int attempt) {
    return [&, world_size, attempt](int rank) {
      return ProcessGroupOptions(rank, world_size)
          .master_port(agent->getPort())
          .agent_store(true)
          .store_prefix("/worker/attempt_" + std::to_string(attempt))
          .timeout(std::chrono::seconds(10));
    };
  };
  auto errors = all_reduce_in_threads(2, options(2, 0));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "<no exception>") << "rank " << r;
  EXPECT_EQ(text(agent->get("/worker/attempt_0/strata/world_size")), "2");
  EXPECT_EQ(text(agent->get("strata/world_size")), "99");
  EXPECT_EQ(text(agent->get("job-7/rdzv")), "agent's");

  // A restarted attempt with a different world size: attempt 0's keys (its
  // world size, Gloo's addresses) must not leak into attempt 1.
  errors = all_reduce_in_threads(3, options(3, 1));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "<no exception>") << "rank " << r;
  EXPECT_EQ(text(agent->get("/worker/attempt_1/strata/world_size")), "3");
}

TEST(ProcessGroupTest, WorldSizeMismatchNamesBothValuesAndTheRank) {
  const int port = strata::find_free_port("127.0.0.1");
  std::string rank0_error, rank1_error;
  std::thread rank0([&] {
    rank0_error = what_of([&] {
      strata::create_process_group(ProcessGroupOptions(0, 2).master_port(port).timeout(std::chrono::seconds(2)));
    });
  });
  rank1_error = what_of([&] {
    strata::create_process_group(ProcessGroupOptions(1, 3).master_port(port).timeout(std::chrono::seconds(2)));
  });
  rank0.join();
  EXPECT_CONTAINS(rank1_error, "rank 1 has WORLD_SIZE 3 but rank 0 has WORLD_SIZE 2");
  EXPECT_CONTAINS(rank1_error, "rank 0's store at MASTER_ADDR:MASTER_PORT 127.0.0.1:" + std::to_string(port));
  // Rank 0 is left waiting for a peer that never joins; it must time out, not hang.
  EXPECT_CONTAINS(rank0_error, "rank 0 of 2 could not connect Gloo to its peers within 2 s");
}

TEST(ProcessGroupTest, PortInUseAndUnreachableStoreNameAddressPortRankAndWorldSize) {
  auto occupant = serve_store(1);
  const int port = occupant->getPort();
  auto msg = what_of([&] {
    strata::create_process_group(ProcessGroupOptions(0, 2).master_port(port).timeout(milliseconds(300)));
  });
  EXPECT_CONTAINS(msg, "rank 0 could not host the rendezvous store on MASTER_PORT " + std::to_string(port) +
                           " (MASTER_ADDR 127.0.0.1, rank 0, WORLD_SIZE 2)");
  EXPECT_CONTAINS(msg, "EADDRINUSE");  // c10d's own reason

  const int closed = strata::find_free_port("127.0.0.1");  // nobody listens there
  const auto start = Clock::now();
  msg = what_of([&] {
    strata::create_process_group(ProcessGroupOptions(1, 2).master_port(closed).timeout(milliseconds(1500)));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_CONTAINS(msg, "could not reach rank 0's store at MASTER_ADDR:MASTER_PORT 127.0.0.1:" +
                           std::to_string(closed) + " within 1.5 s (rank 1, WORLD_SIZE 2)");
  msg = what_of([&] {
    strata::create_process_group(
        ProcessGroupOptions(0, 2).master_port(closed).agent_store(true).timeout(milliseconds(1500)));
  });
  EXPECT_CONTAINS(msg, "could not reach torchrun's agent store at MASTER_ADDR:MASTER_PORT 127.0.0.1:" +
                           std::to_string(closed));
}

TEST(ProcessGroupTest, AMissingRankZeroIsATimeoutNamingTheStore) {
  TempDir dir;
  const auto file = (dir.path() / "store").string();
  const auto start = Clock::now();
  const auto msg = what_of([&] {
    strata::create_process_group(ProcessGroupOptions(1, 2).store_file(file).timeout(milliseconds(500)));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_CONTAINS(msg, "rank 1 did not hear from rank 0 in the FileStore " + file +
                           " (STRATA_STORE_FILE) within 0.5 s");
}

TEST(ProcessGroupTest, GlooInterfacesComeFromGlooSocketIfnameWhenGiven) {
  TempDir dir;
  const auto file = (dir.path() / "store").string();
  auto errors = all_reduce_in_threads(2, [&](int rank) {
    return ProcessGroupOptions(rank, 2).store_file(file).gloo_interfaces("lo").timeout(std::chrono::seconds(10));
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "<no exception>") << "rank " << r;

  const auto msg = what_of([&] {
    strata::create_process_group(
        ProcessGroupOptions(0, 1).store_file((dir.path() / "other").string()).gloo_interfaces("nosuchif0"));
  });
  EXPECT_CONTAINS(msg, "GLOO_SOCKET_IFNAME names interface 'nosuchif0', which Gloo cannot use (rank 0)");
}

TEST(ProcessGroupTest, BackendErrorsNameTheAllowedValues) {
  ProcessGroupOptions opts(0, 1);
  opts.backend("mpi");
  auto msg = what_of([&] { strata::create_process_group(opts); });
  EXPECT_CONTAINS(msg, "'mpi'");
  EXPECT_CONTAINS(msg, "'gloo'");
  EXPECT_CONTAINS(msg, "'nccl'");
  if (!torch::cuda::is_available()) {  // no GPU: NCCL is refused before any process group exists
    opts.backend("nccl");
    msg = what_of([&] { strata::create_process_group(opts); });
    EXPECT_CONTAINS(msg, strata::built_with_cuda() ? "backend 'nccl' needs a CUDA device; none is visible"
                                                   : "backend 'nccl' needs LibTorch with CUDA; this build has only 'gloo'");
  }
  msg = what_of([&] { strata::create_process_group(ProcessGroupOptions(2, 2)); });
  EXPECT_CONTAINS(msg, "RANK 2");
}

TEST(ProcessGroupTest, WorldOfOneProcessGroupWorks) {
  // Port 0: rank 0 hosts its store on any free port (nobody else needs it).
  Comm comm(strata::create_process_group(ProcessGroupOptions(0, 1).master_port(0).timeout(std::chrono::seconds(5))));
  EXPECT_TRUE(comm.is_distributed());
  EXPECT_EQ(comm.size(), 1);
  auto t = torch::ones({3});
  comm.all_reduce(t);
  EXPECT_TRUE(t.equal(torch::ones({3})));
}

}  // namespace
