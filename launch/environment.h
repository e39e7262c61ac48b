#pragma once
// Cluster environments: where this process stands in a world that someone
// else launched (torchrun, SLURM's srun, Open MPI's mpirun, or strata's own
// launcher), read from the environment variables each one sets.
#include <map>
#include <optional>
#include <string>

namespace strata {

/// Where this process stands in the world.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  bool from_environment = false;  ///< joined a world someone else launched

  // How the ranks meet (the rendezvous store); see create_process_group().
  /// STRATA_STORE_FILE: strata's launcher on one machine put a c10d FileStore
  /// at this path (no port is opened). Empty otherwise.
  std::string store_file;
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves a
  /// c10d TCPStore on MASTER_ADDR:MASTER_PORT, so every rank, rank 0 included,
  /// joins it as a client. Otherwise (and without store_file) rank 0 hosts
  /// the store on MASTER_PORT.
  bool agent_store = false;
  /// Key prefix inside the agent's store, as torch 1.13's _create_c10d_store
  /// sets it: "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", so the keys of a
  /// restarted attempt never meet the previous attempt's. (The agent keeps its
  /// own keys under TORCHELASTIC_RUN_ID, so workers need not read that one.)
  std::string store_prefix;
  /// GLOO_SOCKET_IFNAME (comma-separated interfaces for Gloo, as in torch);
  /// empty: the interface that routes to MASTER_ADDR.
  std::string gloo_interfaces;
};

/// Reads the torchrun / SLURM / Open MPI variables from `env` (a copy of the
/// process environment; injectable for tests). nullopt when none are set.
/// Inconsistent values (RANK >= WORLD_SIZE, non-numbers) are errors naming them.
/// The store fields come from the torchrun/strata variables (RANK branch) only.
std::optional<DistEnv> dist_env_from(const std::map<std::string, std::string>& env);
std::map<std::string, std::string> current_environment();

/// The intra-op thread count configure_threads() sets: `requested`, else
/// STRATA_THREADS_PER_RANK, else cores / local_world_size (at least 1).
int resolve_threads(int requested, int local_world_size);
/// Sets torch's intra-op threads: at::set_num_threads(resolve_threads(...)).
void configure_threads(int requested, int local_world_size);

}  // namespace strata
