// strata-bench with local SGD (strata/bench/bench_main.h): its suites and
// sweeps know local-sgd from its spec (`--sweep --strategies ddp,local-sgd`,
// `--suite local-sgd`), and run the strata-gpt beside it (gpt_main.cpp).
#include "local_sgd.h"

#include <strata/bench/bench_main.h>

int main(int argc, char** argv) {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  registry.add(local_sgd::local_sgd_spec());
  return strata::bench::bench_main(argc, argv, registry);
}
