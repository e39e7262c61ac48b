#pragma once
// launch_or_join(): what a training program's main() does first, as
// strata-gpt does it: when no launcher started this process and more than one
// rank is asked for, start the ranks (this binary again, under strata's
// launcher: launch/launcher.h) and report their exit code; otherwise join the
// world a launcher (strata's, torchrun, SLURM, mpirun) set up, on this rank's
// device, with its threads configured. For programs that bring their own
// model and loop around strata's Trainer (examples/vit_classifier).
//
//   int main(int argc, char** argv) {
//     auto world = strata::recipes::launch_or_join({argv, argv + argc}, strata::recipes::WorldOptions().nproc(2));
//     if (world.launcher_exit_code) return *world.launcher_exit_code;   // the launcher: the ranks ran
//     auto strategy = registry.create(strategy_name, world.comm, {}, world.context());
//     ...
//   }
#include "strata/launch/environment.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/spec.h"

#include <torch/arg.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

struct WorldOptions {
  /// Ranks to launch on this machine when no launcher started this process.
  TORCH_ARG(int, nproc) = 1;
  /// auto (cuda:LOCAL_RANK when CUDA is usable, else cpu), cpu or cuda.
  TORCH_ARG(std::string, device) = "auto";
  /// Intra-op threads per rank (0: cores / local ranks).
  TORCH_ARG(int, threads_per_rank) = 0;
  /// Every collective and the rendezvous fail after this long (never hang).
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
};

/// Where this process trains.
struct World {
  /// Set when this process launched the ranks (and they have finished): their
  /// exit code (0: every rank succeeded), for main() to return. The ranks'
  /// errors were printed, each naming its rank.
  std::optional<int> launcher_exit_code;
  /// This rank's world (a world of one when nobody launched it and nproc is 1).
  Comm comm;
  /// The launcher's variables (nullopt: a process of its own).
  std::optional<DistEnv> env;
  int local_world_size() const { return env ? env->local_world_size : 1; }
  /// The context a strategy of this world is built with (StrategySpec::factory).
  StrategyContext context() const;
};

/// This running binary's path (/proc/self/exe), else `argv0`: what a launcher
/// re-executes for its ranks.
std::string self_executable(const std::string& argv0);

/// The world a launcher set up (`env`), on `device`: its process group over
/// the launcher's store (Gloo on CPU, NCCL on CUDA), able to split into
/// subgroups. Collective: every rank of the world calls it.
Comm join_world(const DistEnv& env, const torch::Device& device, std::chrono::milliseconds timeout);

/// See the file comment. `argv` is the whole command line (argv[0] the
/// program): the ranks get it unchanged, so they parse what this process
/// parsed. Throws c10::ValueError for a launcher's inconsistent variables or
/// an unusable device; c10::Error when the world cannot form (a rank missing,
/// an address unreachable), naming it.
World launch_or_join(std::vector<std::string> argv, const WorldOptions& options);

}  // namespace strata::recipes
