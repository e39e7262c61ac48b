#pragma once
// Phase 1 of strata-gpt (run_gpt): everything that can be wrong with the
// input, checked before any rank starts and before anything is written. Every
// error is a c10::Error with one line naming the value and what is allowed;
// run_gpt prints it and exits 2, leaving the output directory and every input
// as they were.
#include "strata/launch/environment.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/app/model_keys.h"
#include "strata/recipes/models/spec.h"
#include "strata/recipes/app/planner.h"
#include "strata/strategies/registry.h"
#include "strata/trainer/data_source.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

struct PipelineLayout;  // pipeline_plan.h

/// What phase 1 resolved: the config to train with (--strategy auto and
/// --resume resolved), the command line a launcher hands its ranks, the data,
/// the model (resolved by the model registry) and --init-from's weights
/// (checked against the model).
struct CheckedRun {
  RunConfig config;
  std::vector<std::string> args;
  std::unique_ptr<DataSource> data;
  ModelPtr model;             ///< resolved by check_run (models/spec.h)
  std::string model_label;    ///< its preset, or the --init-from directory that gave it
  ModelKeys model_keys;       ///< the registered families' keys: config.ini lists them
  ParameterSourcePtr init_weights;
  /// --pp-size > 1: the stages' cut and what each pipeline rank holds (the
  /// planner's; a GPT's meta build costs seconds at gpt2-xl, so made once).
  std::shared_ptr<const PipelineLayout> pipeline;
};

/// The world the run will have: from the launcher's variables, or from
/// --nproc (ranks per machine) x --nnodes when strata-gpt launches itself.
struct WorldShape {
  int world = 1;
  int local_ranks = 1;
  int local_rank = 0;  ///< this process's (0 for a launcher)
  /// Data-parallel ranks: the world over --tp-size and --pp-size (the
  /// strategy's world, the batch's).
  int data = 1;
};
WorldShape world_shape(const RunConfig& config, const std::optional<DistEnv>& env);

/// Whether this process speaks for its machine (once per machine, before any
/// rank starts): strata-gpt itself (no `env`: it launches its own ranks or is
/// the only process), or local rank 0 of another launcher. strata's own ranks
/// (STRATA_ERROR_FILE marks them) leave it to their launcher.
bool speaks_for_machine(const std::optional<DistEnv>& env);

/// Runs every phase-1 check in order; throws the first error. `env`: the
/// world a launcher set up (none when strata-gpt launches its own ranks).
CheckedRun check_run(RunConfig config, std::vector<std::string> args, const std::optional<DistEnv>& env,
                     const StrategyRegistry& registry, const ModelRegistry& models);

/// What `config` asks the model registry for, given the data's vocabulary
/// and sequence length: its preset ("" when not given: an --init-from
/// directory may then give the model, else config.preset is the default)
/// and the model options given.
ModelRequest model_request(const RunConfig& config, int64_t vocab_size, int64_t block_size);

/// The planner's request for `config`'s run of `model` under its strategy
/// (config.strategy, a registered name, with config.strategy_options), over
/// `world` data-parallel ranks, `local_world` of them per machine (with
/// --tp-size T: the job's over T).
PlanRequest plan_request(const RunConfig& config, const ModelPtr& model, int world, int local_world);

/// What a strategy of this run is built and checked with: the world, the
/// device, --precision and --offload.
StrategyContext strategy_context(const RunConfig& config, int world, int local_world, const torch::Device& device);

/// --offload-dir, or the output directory when it is not given.
std::string offload_dir_of(const RunConfig& config);

/// One error unless checkpoint `dir` holds exactly `model`'s tensors (names
/// and shapes of its parameters and buffers) and `optimizer`'s kind of state;
/// reads metadata.json only.
void check_resume_matches(const std::string& dir, torch::nn::Module& model, const std::string& optimizer);

/// A --resume whose data position `data_ranks` data-parallel ranks cannot
/// continue from, before any rank starts (each would find it at load time).
void check_resume_position(const RunConfig& config, int data_ranks);

}  // namespace strata::recipes
