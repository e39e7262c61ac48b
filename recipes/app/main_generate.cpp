// strata-generate: text from a trained model (recipes/app/generate.h; docs/data.md).
//
//   strata-generate Llama-dir/ --prompt "The capital of France is" --max-new-tokens 32 --temperature 0
#include "strata/recipes/app/generate.h"

int main(int argc, char** argv) {
  strata::recipes::ModelRegistry models;
  strata::recipes::register_builtin_models(models);
  strata::StrategyRegistry strategies;
  strata::register_builtin_strategies(strategies);
  return strata::recipes::run_generate(argc, argv, strategies, models);
}
