#pragma once
// The built-in strategies' registry, built once per test binary: what
// strata-gpt, its parser, the planner and strata-bench read the specs from.
#include "strata/strategies/registry.h"

namespace strata::testing {

inline const StrategyRegistry& builtin_strategies() {
  static const StrategyRegistry registry = [] {
    StrategyRegistry r;
    register_builtin_strategies(r);
    return r;
  }();
  return registry;
}

}  // namespace strata::testing
