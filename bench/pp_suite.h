#pragma once
// The pp suite: pipeline parallelism (strategies/pp, docs/pipeline.md) on the
// bench family's medium model with 8 equal blocks, 2 ranks x 1 thread: every
// schedule at 2, 4 and 8 micro-batches beside ddp at the same micro-batches,
// and each rank's measured bubble (the run's pipeline.json, which the runner
// puts under summary["pipeline"]) beside the schedule's simulation and its
// closed formula, as a table and a chart.
//
//   Suite s = pp_suite(strategies, models.bench_family().bench());   // pp/gpt-mini/pp2-1f1b-m4-2x1, ...
//   std::cout << pp_markdown(runs);
//   draw_charts({{"pp_bubble", pp_bubble_chart(runs), "..."}}, out_dir);
#include "strata/bench/charts.h"
#include "strata/bench/harness.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <string>
#include <vector>

namespace strata::bench {

/// The schedules the suite runs (each at 2, 4 and 8 micro-batches; the
/// interleaved one with 2 stages per rank).
std::vector<std::string> pp_suite_schedules();

Suite pp_suite(const StrategyRegistry& strategies, const recipes::BenchWorkloads& w);

/// Markdown: per pipeline case, each rank's idle share (median over
/// repeats), the simulation's and the formula's; "" when no run has a
/// pipeline.
std::string pp_markdown(const std::vector<CaseRun>& runs);

/// The bubble per schedule: a panel per micro-batch count, a cluster per
/// schedule, bars for the measured idle share (mean over ranks, median over
/// repeats), the simulation's and the formula's.
PanelChart pp_bubble_chart(const std::vector<CaseRun>& runs);

}  // namespace strata::bench
