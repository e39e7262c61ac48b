#include "strata/recipes/app/world.h"

#include "strata/core/cuda_support.h"
#include "strata/core/device.h"
#include "strata/launch/launcher.h"
#include "strata/strategies/process_group.h"

#include <filesystem>

namespace strata::recipes {

StrategyContext World::context() const {
  StrategyContext c;
  c.world_size = comm.size();
  c.local_world_size = local_world_size();
  c.device = comm.device();
  return c;
}

std::string self_executable(const std::string& argv0) {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? argv0 : path.string();
}

Comm join_world(const DistEnv& env, const torch::Device& device, std::chrono::milliseconds timeout) {
  return create_world_comm(ProcessGroupOptions(env.rank, env.world_size)
                               .master_addr(env.master_addr)
                               .master_port(env.master_port)
                               .store_file(env.store_file)
                               .agent_store(env.agent_store)
                               .store_prefix(env.store_prefix)
                               .gloo_interfaces(env.gloo_interfaces)
                               .backend(backend_for(device))
                               .timeout(timeout),
                           device);
}

World launch_or_join(std::vector<std::string> argv, const WorldOptions& options) {
  TORCH_CHECK_VALUE(options.nproc() >= 1, "launch_or_join: nproc must be >= 1, got ", options.nproc());
  TORCH_CHECK_VALUE(!argv.empty(), "launch_or_join: argv needs the program name");
  World world;
  world.env = dist_env_from(current_environment());
  if (!world.env && options.nproc() > 1) {
    // The ranks run this very binary (its path, not argv[0], which may be relative to a PATH entry).
    argv[0] = self_executable(argv[0]);
    LaunchOptions launch;
    launch.nproc = options.nproc();
    launch.threads_per_rank = options.threads_per_rank();
    world.launcher_exit_code = launch_ranks(argv, launch);
    return world;
  }
  const int local_rank = world.env ? world.env->local_rank : 0;
  configure_threads(options.threads_per_rank(), world.local_world_size());
  const torch::Device device = resolve_device(options.device(), local_rank);
  // Before the process group: NCCL binds each rank to the current device.
  if (device.is_cuda()) set_cuda_device(device.index());
  if (!world.env) {
    world.comm = Comm(device);
    return world;
  }
  world.comm = join_world(*world.env, device, options.timeout());
  return world;
}

}  // namespace strata::recipes
