#pragma once
// run_export(): what strata-export's main() does. A checkpoint's model
// tensors (either format, any strategy and world size) are written in one
// process as one of its family's weight formats (ModelConfig::weight_formats):
// the model is resolved from the run's config.ini as the run resolved it,
// through the same ModelRegistry, so a user's family exports as the
// built-ins do.
//
//   strata-export runs/gpt gpt.pt                    # newest checkpoint, the family's first format
//   strata-export --format hf runs/llama out-hf/     # a transformers directory
//   strata-export --config elsewhere/config.ini step-500 out.pt
//
// Exit codes: 0 written, 2 bad input (one line naming the value), 1 a write
// that failed.
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

namespace strata::recipes {

/// With the built-in strategies and model families.
int run_export(int argc, char** argv);
/// With `strategies` (to read the run's config.ini, which names their
/// options) and the families of `models`.
int run_export(int argc, char** argv, const StrategyRegistry& strategies, const ModelRegistry& models);

}  // namespace strata::recipes
