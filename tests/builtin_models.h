#pragma once
// The built-in model families' registry (gpt, llama) and its command-line
// keys, built once per test binary: what strata-gpt's parser reads.
#include "strata/recipes/app/model_keys.h"
#include "strata/recipes/models/spec.h"

namespace strata::testing {

inline const recipes::ModelRegistry& builtin_models() {
  static const recipes::ModelRegistry registry = [] {
    recipes::ModelRegistry r;
    recipes::register_builtin_models(r);
    return r;
  }();
  return registry;
}

inline const recipes::ModelKeys& builtin_model_keys() {
  static const recipes::ModelKeys keys = recipes::cli_keys(builtin_models());
  return keys;
}

}  // namespace strata::testing
