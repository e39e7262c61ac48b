#pragma once
// strata-gpt --dry-run --nproc N: the strategy's real sharding plan for N
// ranks, in one process, without training (torchtitan's fake-backend dry run).
//
// Each simulated rank builds the model deferred (meta tensors: shapes, no
// memory), joins a fake world of N (strategies/fake_world.h: every collective
// completes at once and moves nothing), runs the strategy's real setup and
// two real steps (forward, backward, gradient sync, clip, optimizer step,
// the loss's mean), the strategy calls Trainer::run_step makes; without
// autocast and loss scaling, which change no collective of a step that is
// not skipped (a 16-mixed run's overflowed step skips the optimizer's). So the layout
// is the strategy's own, the model state is what its tensors would hold, and
// the collectives are the ones a real run issues: Comm counts their bytes
// and the flight recorder lists them. No data is read; activations come from
// the memory planner (recipes/app/planner.h).
//
// Ranks 0 and N-1 are simulated (the data-parallel ranks hold alike, up to
// the last rank's padding); under a pipeline each stage's first rank. gpt2-xl at 1,024 ranks: 7-9 s per strategy on
// a 2-core VM, most of it building the model's modules (docs/dry-run.md).
#include "strata/recipes/app/run_checks.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/pp/stage_module.h"
#include "strata/strategies/registry.h"
#include "strata/strategies/strategy.h"

#include <string>
#include <vector>

namespace strata::recipes {

/// What one simulated rank holds and sends.
struct DryRunRank {
  int rank = 0;
  int64_t n_params = 0;                            ///< the model's
  std::string layout;                              ///< Strategy::describe()
  std::string stages;                              ///< under a pipeline: "stage 0: blocks 0..3 + embedding"
  int pp_rank = 0;                                 ///< under a pipeline: this rank's place in it
  std::vector<pp::StageCut> cuts;                  ///< under a pipeline: every stage's
  int64_t stage_params = 0, stage_trainable = 0;   ///< elements this rank's module holds whole (tp parts)
  ModelStateBytes state;                           ///< after the first optimizer step
  CommBytes per_step;                              ///< bytes sent in the second step
  std::vector<CollectiveRecord> step_collectives;  ///< the second step's, in order
};

/// Links meta_kernels.cpp's registrations (kernels LibTorch's C++ library
/// lacks on the meta device) into the binary; does nothing else.
void link_meta_kernels();

/// Simulates rank `rank` of `world` for the checked run.
DryRunRank simulate_rank(const CheckedRun& run, const StrategyRegistry& registry, int rank, int world);

/// strata-gpt --dry-run: simulates, prints the report to stdout, writes
/// nothing. Returns the exit code.
int run_dry(const CheckedRun& run, const StrategyRegistry& registry);

}  // namespace strata::recipes
