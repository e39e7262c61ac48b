#pragma once
// strata-bench's main over a registry of strategies (bench/bench_main.cpp):
// strata-bench runs it with the built-ins; a project with strategies of its
// own builds its own strata-bench (and strata-gpt: recipes/app/run.h) around its
// registry, and its strategies get suites, sweep cases, report rows and chart
// colours from their specs.
//
//   int main(int argc, char** argv) {
//     strata::StrategyRegistry strategies;
//     strata::register_builtin_strategies(strategies);
//     strategies.add(my_strategy_spec());
//     return strata::bench::bench_main(argc, argv, strategies);
//   }
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

namespace strata::bench {

/// strata-bench: parse argv, run the suites or sweep with `--gpt` (default:
/// strata-gpt beside this binary), report and gate. Exit codes: 0 ok, 1 a
/// case failed or regressed, 2 bad input.
int bench_main(int argc, char** argv, const StrategyRegistry& strategies);
/// The same over a registry of model families too: --sweep --presets takes
/// theirs (a project's own strata-gpt registers the same families).
int bench_main(int argc, char** argv, const StrategyRegistry& strategies, const recipes::ModelRegistry& models);

}  // namespace strata::bench
