// This project's strata-gpt: strata's recipe binary over the built-in models
// and strategies plus this project's model family (bigram_mlp.h).
#include "bigram_mlp.h"

#include <strata/recipes/app/run.h>
#include <strata/strategies/registry.h>

int main(int argc, char** argv) {
  strata::StrategyRegistry strategies;
  strata::register_builtin_strategies(strategies);
  strata::recipes::ModelRegistry models;
  strata::recipes::register_builtin_models(models);
  models.add(own_model::bigram_mlp_spec());
  return strata::recipes::run_gpt(argc, argv, strategies, models);
}
