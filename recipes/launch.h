#pragma once
// Launch: run a binary as N ranks, like torchrun.
//
// resolve_launch() decides, from the environment and --nproc, whether this
// process is (a) a rank joining an existing world (RANK/WORLD_SIZE set by
// torchrun or our own launcher; SLURM_PROCID/SLURM_NTASKS; OMPI_COMM_WORLD_*),
// (b) the launcher that must spawn N copies of itself, or (c) a single process.
// launch_ranks() does (b): re-executes /proc/self/exe N times with the torchrun
// environment, waits, and if one rank fails stops the others and returns non-zero
// with a message naming the rank and its error. SIGINT/SIGTERM to the launcher
// are forwarded to every rank.
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

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

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;          ///< 0: pick a free port on master_addr
  int threads_per_rank = 0;     ///< 0: cores / nproc (at least 1)
  std::chrono::seconds grace{5};///< SIGTERM -> SIGKILL delay when stopping ranks
};

/// A free TCP port on `addr` (bind to port 0, read it back, close).
int find_free_port(const std::string& addr);

/// Spawns the ranks and waits. Returns 0 if all succeeded, else non-zero after
/// printing "strata: rank R failed (exit code C): <its error>" to stderr.
int launch_ranks(const std::vector<std::string>& argv, const LaunchOptions& options);

/// Error file a rank writes its one-line error to, so the launcher can name it
/// (torchrun's TORCHELASTIC_ERROR_FILE idea). Empty when not launched by us.
std::string rank_error_file();
/// Writes `message` to rank_error_file() if set and no error was recorded yet
/// (the first error is the root cause); never throws.
void record_rank_error(const std::string& message);

/// Sets torch's intra-op threads: `requested` if > 0, else cores / local ranks.
void configure_threads(int requested, int local_world_size);

}  // namespace strata::recipes
