#pragma once
// strata-gpt's phase-1 memory decisions (planner.h, pipeline_plan.h):
// --strategy auto's choice and the pre-flight memory check, each over the
// whole model's ranks or, with --pp-size, each pipeline stage's.
#include "strata/recipes/app/run_checks.h"

#include <optional>

namespace strata::recipes {

/// --strategy auto: the planner's fastest candidate predicted to fit the
/// budget (--memory-budget, the GPU's memory, or this machine's available
/// memory over its ranks) becomes the config's strategy, and the launcher's
/// command line names it. With --pp-size the candidates run over a stage's
/// data-parallel ranks and each is predicted per pipeline rank. Returns the
/// activation profile it measured. c10::ValueError (exit 2, the table) when
/// nothing fits.
ActivationProfile choose_strategy(CheckedRun& run, const std::optional<DistEnv>& env, const StrategyRegistry& registry);

/// The pre-flight memory check: the planner's predicted peaks of this
/// machine's ranks (each its pipeline stage's with --pp-size) must fit its
/// available memory; c10::ValueError naming them and what would fit.
void check_memory(const CheckedRun& run, const StrategyRegistry& registry, const std::optional<DistEnv>& env,
                  std::optional<ActivationProfile> profile);

}  // namespace strata::recipes
