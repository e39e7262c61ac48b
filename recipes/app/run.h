#pragma once
// run_gpt(): what strata-gpt's main() does — parse, launch ranks or join a
// world, build data/model/strategy/callbacks, fit, and write the outputs:
//   <output-dir>/config.ini    resolved configuration (same keys as the CLI)
//   <output-dir>/metrics.csv   one row per logged step (CsvLogger; a resume appends)
//   <output-dir>/checkpoints/  step-<N> directories (--checkpoint-every, --checkpoint-monitor)
//   <output-dir>/summary.json  written last: its presence marks a finished run
// Exit codes: 0 success, 2 bad input (one-line error), 1 failure in training.
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/trainer/trainer.h"

#include <string>
#include <vector>

namespace strata::recipes {

/// With the built-in strategies.
int run_gpt(int argc, char** argv);
/// With the strategies of `registry` (the built-ins and a user's own, each
/// selectable by --strategy, its options flags of their own, listed in
/// --help and planned by --strategy auto): a user's strata-gpt.
int run_gpt(int argc, char** argv, const StrategyRegistry& registry);

/// With the strategies of `registry` and the model families of `models` (the
/// built-ins, models/spec.h, and a user's own: each of its presets selectable
/// by --preset, planned, checked and dry-run as the built-ins are).
int run_gpt(int argc, char** argv, const StrategyRegistry& registry, const ModelRegistry& models);

/// <output-dir>/checkpoints: where --checkpoint-every writes step-<N>.
std::string checkpoints_dir(const RunConfig& config);

/// The checkpoint directory --resume names: "" (no resume), the given
/// directory, for "last" the newest step-<N> in checkpoints_dir(), for "auto"
/// the newest complete one there or "" (start fresh) when there is none.
/// "auto" appends its one-line decision, and each incomplete checkpoint it
/// skipped, to `notes`. Throws c10::ValueError (one line, exit 2) for "last"
/// with no checkpoint, "auto" with none beside a finished run's summary.json
/// (starting fresh would overwrite that run's outputs), a path that is not a
/// directory, or a step-<N> directory with N >= --max-steps.
std::string resolve_resume(const RunConfig& config, std::vector<std::string>* notes = nullptr);

/// Trainer options from a config.
TrainerOptions trainer_options(const RunConfig& config);

}  // namespace strata::recipes
