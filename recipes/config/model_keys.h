#pragma once
// The model families' part of strata-gpt's command line: --preset's values
// and the options the registered families declare (recipes/app/run_checks.h's
// cli_keys builds it from a recipes/models/spec.h ModelRegistry). The CLI parses these keys as it parses
// its own (command line, --config, --help, config.ini) and keeps each given
// value as canonical text in RunConfig::model_options. A value every
// declaring family's rule (range, choices) refuses is refused there; the
// resolved family checks its own rule when the registry resolves the model.
#include "strata/strategies/spec.h"

#include <string>
#include <vector>

namespace strata::recipes {

/// One model key as the CLI shows it.
struct ModelKey {
  StrategyOption option;                 ///< its first declaration (kind, default for --help)
  std::vector<std::string> families;  ///< every family that reads it, in registration order
  std::vector<StrategyOption> declared;  ///< each family's declaration (same order): its rule
  std::string help;                   ///< the first declaration's help, or each family's when they differ
};

struct ModelKeys {
  std::vector<std::string> presets;  ///< every family's, in registration order
  std::string default_preset;        ///< --preset when none is given
  std::vector<ModelKey> options;     ///< each key once, in declaration order
};

}  // namespace strata::recipes
