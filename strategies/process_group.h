#pragma once
// Process-group creation: the rendezvous store, then Gloo on CPU or NCCL on
// cuda:LOCAL_RANK (cuda_support.cpp).
//
// The store is c10d's own, chosen by where the ranks come from:
// - one machine, strata's launcher: c10d::FileStore in the launcher's
//   temporary directory (STRATA_STORE_FILE) — no port, nothing listening;
// - torchrun (TORCHELASTIC_USE_AGENT_STORE=True): its agent already serves a
//   c10d::TCPStore on MASTER_ADDR:MASTER_PORT, so every rank, rank 0
//   included, is a client, under torch's "/worker/attempt_<restart>" prefix;
// - anything else (SLURM, mpirun, several nodes, by hand): rank 0 hosts a
//   c10d::TCPStore on MASTER_PORT, the others connect to MASTER_ADDR.
//   LibTorch 1.13's server listens on every interface ([::] dual-stack,
//   measured with `ss -ltn`: *:PORT even when given 127.0.0.1), as it does for
//   every torch job started that way.
//
// Why no store of strata's own (it had a ~670-line TCP store that listened on
// MASTER_ADDR only): the case that motivated it, one machine, now opens no
// port at all; where rank 0 must host a store, its node has to be reachable
// at MASTER_ADDR by every other node anyway, and the wildcard adds only its
// other interfaces — the exposure of any torch env:// or torchrun job, which
// a cluster's network already has to contain.
#include "strata/strategies/comm.h"

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace strata {

struct ProcessGroupOptions {
  ProcessGroupOptions(int rank, int world_size) : rank_(rank), world_size_(world_size) {}
  TORCH_ARG(int, rank);
  TORCH_ARG(int, world_size);
  /// Where rank 0 (or torchrun's agent) serves the TCP store; Gloo binds to
  /// the local address that routes there.
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  TORCH_ARG(int, master_port) = 29500;
  /// Every collective and the rendezvous fail after this long (never hang).
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// "gloo" or "nccl" ("nccl" only when LibTorch has CUDA).
  TORCH_ARG(std::string, backend) = "gloo";
  /// Non-empty: meet in a c10d::FileStore at this path instead of over TCP.
  TORCH_ARG(std::string, store_file) = "";
  /// A TCP store already runs at master_addr:master_port (torchrun's agent):
  /// every rank is a client. false: rank 0 hosts it.
  TORCH_ARG(bool, agent_store) = false;
  /// Keys go under this prefix; "" for none.
  TORCH_ARG(std::string, store_prefix) = "";
  /// GLOO_SOCKET_IFNAME: comma-separated interfaces for Gloo's sockets; ""
  /// picks the interface that routes to master_addr.
  TORCH_ARG(std::string, gloo_interfaces) = "";
};

/// The rendezvous store the options describe. Errors name the store (path,
/// or address and port), the rank and the world size.
c10::intrusive_ptr<c10d::Store> create_store(const ProcessGroupOptions& options);

/// Rendezvous and build the process group; errors name the address, port,
/// rank and world size involved (port in use, address unreachable, a rank
/// whose WORLD_SIZE disagrees with rank 0's).
c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(const ProcessGroupOptions& options);

/// create_process_group, wrapped in a Comm on `device` that can split() into
/// subgroups over the same store (subgroup_factory with the options' backend,
/// timeout and addresses). What recipes hand to strategies.
Comm create_world_comm(const ProcessGroupOptions& options, torch::Device device);

/// Subgroups of the world that met in `store`: each is a new process group
/// (Gloo, or NCCL for backend "nccl") over a c10d::PrefixStore of `store`
/// under the subgroup's key, so its rendezvous keys never meet the world's or
/// another subgroup's. LibTorch 1.13's C++ API has no new_group(); this is
/// what torch.distributed.new_group does underneath.
SubgroupFactory subgroup_factory(const c10::intrusive_ptr<c10d::Store>& store, const std::string& backend,
                                 std::chrono::milliseconds timeout, const std::string& master_addr = "127.0.0.1",
                                 const std::string& interfaces = "");

/// A Gloo group over an existing store (tests: ranks as threads on a HashStore).
/// Gloo's sockets bind to the interfaces named in `interfaces` (comma-separated,
/// torch's GLOO_SOCKET_IFNAME) or else to this machine's address that routes
/// to `master_addr` (127.0.0.1: loopback only).
c10::intrusive_ptr<c10d::ProcessGroup> create_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
    std::chrono::milliseconds timeout, const std::string& master_addr = "127.0.0.1",
    const std::string& interfaces = "");

}  // namespace strata
