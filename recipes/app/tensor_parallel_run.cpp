#include "strata/recipes/app/tensor_parallel_run.h"

#include "strata/strategies/tp/mesh.h"

#include <c10/util/Exception.h>

namespace strata::recipes {

void check_tensor_parallel(const RunConfig& c, const ModelConfig& model, const StrategyRegistry& registry, int world,
                           int local_ranks) {
  if (c.tp_size == 1) {
    TORCH_CHECK_VALUE(!c.sequence_parallel, "--sequence-parallel splits activations over tensor-parallel ranks; "
                      "it needs --tp-size > 1 (got --tp-size 1)");
    return;
  }
  tp::MeshDims::of(world, c.tp_size);  // throws when tp does not divide the world
  // Hybrid placement: tensor parallelism sends every block's activations, so
  // its groups stay inside a machine; the strategy goes across machines.
  TORCH_CHECK_VALUE(world == local_ranks || local_ranks % c.tp_size == 0, "--tp-size ", c.tp_size,
                    " must divide the ranks per machine (", local_ranks, ") when the job spans machines: a "
                    "tensor-parallel group of consecutive ranks would cross one");
  TORCH_CHECK_VALUE(c.torchscript.empty(), "--tp-size ", c.tp_size, " splits a registered model by its plan; a "
                    "--torchscript model has none");
  // Its column- and row-parallel layers are not checkpointed ops (their
  // collectives would have to be replayed too).
  TORCH_CHECK_VALUE(c.ac_policy != "op", "--ac-policy op keeps matmul outputs, which --tp-size ", c.tp_size,
                    "'s tensor-parallel layers do not support yet; use --ac-policy attention or full");
  TORCH_CHECK_VALUE(c.strategy != "auto", "--strategy auto chooses the tensor-parallel size itself; leave out "
                    "--tp-size ", c.tp_size, " or name the strategy");
  if (registry.contains(c.strategy) && !registry.spec(c.strategy).tensor_parallel()) {
    std::string composes;
    for (const auto* spec : registry.specs()) {
      if (spec->tensor_parallel()) composes += (composes.empty() ? "" : ", ") + spec->name();
    }
    TORCH_CHECK_VALUE(false, "--tp-size ", c.tp_size, ": strategy '", c.strategy,
                      "' does not run beside tensor parallelism yet; use one of ", composes);
  }
  const std::string problem = model.tensor_parallel_problem(c.tp_size, c.sequence_parallel);
  TORCH_CHECK_VALUE(problem.empty(), "--tp-size ", c.tp_size, ": ", problem);
}

TensorParallelRun apply_tensor_parallel(const RunConfig& c, const Comm& world, TrainingModule& module) {
  if (c.tp_size == 1) return {world, nullptr};
  const auto mesh = tp::MeshDims::of(world.size(), c.tp_size);
  // Collective: every rank makes the same two splits in the same order.
  Comm tp_group = world.split("tp", mesh.tp_groups());
  Comm dp_group = world.split("dp", mesh.dp_groups());
  auto parallel = std::make_shared<tp::TensorParallel>(
      world, tp_group, tp::TensorParallelOptions().sequence_parallel(c.sequence_parallel));
  parallel->apply(module);
  return {dp_group, parallel};
}

}  // namespace strata::recipes
