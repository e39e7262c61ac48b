#pragma once
// A strata-gpt run's checkpoint read back in one process, for the tools that
// use a trained model outside the run (strata-export, strata-generate): the
// model is resolved from the run's config.ini as the run resolved it, and
// the checkpoint's tensors (either format, any strategy and world size) are
// checked to be that model's parameters.
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/registry.h"

#include <string>

namespace strata::recipes {

struct RunCheckpoint {
  std::string checkpoint;  ///< the step-<N> directory
  std::string ini;         ///< the run's config.ini
  RunConfig config;        ///< as config.ini records it
  int64_t vocab_size = 0;  ///< the model's, as config.ini records them
  int64_t block_size = 0;
  ModelPtr model;
};

/// True for a checkpoint directory (step-<N>, its metadata.json) or an
/// output directory with at least one under checkpoints/.
bool is_run_checkpoint(const std::string& path);

/// The checkpoint `path` names (itself, or an output directory's newest) and
/// the model of the run's config.ini (`config`, or "": the one beside the
/// checkpoints/ directory). Reads no tensors; errors are one line naming
/// the path.
RunCheckpoint run_checkpoint(const std::string& path, const std::string& config, const StrategyRegistry& strategies,
                             const ModelRegistry& models);

/// The checkpoint's model tensors, each the model's parameter in its shape,
/// and no others (else an error naming the first that differs).
NamedTensors run_checkpoint_tensors(const RunCheckpoint& run);

}  // namespace strata::recipes
