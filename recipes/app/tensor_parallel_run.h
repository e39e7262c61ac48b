#pragma once
// strata-gpt's --tp-size and --sequence-parallel: the checks of phase 1 and
// the mesh of phase 2 (strategies/tp). Tensor-parallel groups are
// consecutive ranks (tp::MeshDims), so with --nproc a multiple of --tp-size
// each group is on one machine and the strategy runs across machines.
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/tp/tensor_parallel.h"

#include <memory>

namespace strata::recipes {

/// Phase 1: throws c10::ValueError (one line naming the value, exit 2) when
/// `c` asks for tensor parallelism this run cannot have: a size that does not
/// divide the world of `world` ranks (nor, on several machines, their
/// `local_ranks` each) or the model, a strategy whose spec does
/// not compose with it, or what is not split yet (offload, the dry run,
/// --torchscript, --strategy auto). Nothing when tp_size is 1.
void check_tensor_parallel(const RunConfig& c, const ModelConfig& model, const StrategyRegistry& registry, int world,
                           int local_ranks);

/// The data-parallel ranks the strategy runs over, and the tensor-parallel
/// dimension beside it (null when --tp-size is 1: then `strategy_comm` is
/// the world).
struct TensorParallelRun {
  Comm strategy_comm;
  std::shared_ptr<tp::TensorParallel> tensor_parallel;
};

/// Phase 2, on every rank (collective: splits `world`): the groups, and
/// `module` split over this rank's tensor-parallel group.
TensorParallelRun apply_tensor_parallel(const RunConfig& c, const Comm& world, TrainingModule& module);

}  // namespace strata::recipes
