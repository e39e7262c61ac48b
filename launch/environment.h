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
};

/// Reads the torchrun / SLURM / Open MPI variables from `env` (a copy of the
/// process environment; injectable for tests). nullopt when none are set.
/// Inconsistent values (RANK >= WORLD_SIZE, non-numbers) are errors naming them.
std::optional<DistEnv> dist_env_from(const std::map<std::string, std::string>& env);
std::map<std::string, std::string> current_environment();

/// Sets torch's intra-op threads: `requested` if > 0, else
/// STRATA_THREADS_PER_RANK, else cores / local ranks.
void configure_threads(int requested, int local_world_size);

}  // namespace strata
