// strata-gpt with local SGD: strata's GPT recipe binary (strata/recipes/app/run.h)
// over a registry holding the built-in strategies and this one, so
// `--strategy local-sgd --sync-every 8 --nproc 2` works, --help lists it and
// its options, and --strategy auto's table shows it.
#include "local_sgd.h"

#include <strata/recipes/app/run.h>

int main(int argc, char** argv) {
  strata::StrategyRegistry registry;
  strata::register_builtin_strategies(registry);
  registry.add(local_sgd::local_sgd_spec());
  return strata::recipes::run_gpt(argc, argv, registry);
}
