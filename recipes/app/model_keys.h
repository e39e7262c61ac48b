#pragma once
// The bridge from the model families (recipes/models/spec.h) to strata-gpt's
// command line (recipes/config/model_keys.h): app is the part that may see both.
#include "strata/recipes/config/model_keys.h"
#include "strata/recipes/models/spec.h"

namespace strata::recipes {

/// The presets and every registered family's options, each key once with
/// the families that read it and each one's declaration, for strata-gpt's
/// command line.
ModelKeys cli_keys(const ModelRegistry& models);

}  // namespace strata::recipes
