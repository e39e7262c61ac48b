#pragma once
// The planner suite: strata-gpt's memory planner (recipes/app/planner.h) against
// measured peaks. Each case's summary.json carries the planner's
// "predicted_peak_bytes" beside the measured "peak_tensor_bytes"; the table
// shows both and the error (target: within 10% on every case).
#include "strata/bench/harness.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <string>
#include <vector>

namespace strata::bench {

/// The bench family's planner presets (BenchWorkloads::planner; the
/// built-ins: gpt-nano/micro/mini) x every multi-rank strategy with a memory
/// model and the bench variants its spec puts in "planner" (the built-ins:
/// ddp, oss, sdp, fsdp, fsdp + activation checkpointing), 2 ranks x 1 thread,
/// block 128, batch 8, a few steps (memory is exact): the cases the planner's
/// constants were fitted on; then every family's held-out cases (names
/// starting kHeldOutPrefix) at other widths, block and batch sizes and world
/// sizes, the variants taking turns.
Suite planner_suite(const StrategyRegistry& strategies, const recipes::ModelRegistry& models);

inline constexpr const char* kHeldOutPrefix = "planner/held-out/";

/// Markdown: case, predicted peak, measured peak (max over ranks and repeats),
/// error (predicted ÷ measured - 1), and the max |error|. Runs without a
/// prediction are skipped.
std::string planner_markdown(const std::vector<CaseRun>& runs);

}  // namespace strata::bench
