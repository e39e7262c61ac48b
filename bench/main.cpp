// strata-bench (bench/bench_main.h) over the built-in strategies.
#include "strata/bench/bench_main.h"

int main(int argc, char** argv) {
  strata::StrategyRegistry strategies;
  strata::register_builtin_strategies(strategies);
  return strata::bench::bench_main(argc, argv, strategies);
}
