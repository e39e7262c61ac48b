#pragma once
// strata-gpt's --pp-size, --pp-schedule, --pp-virtual-stages and --pp-split
// (strategies/pp, docs/pipeline.md): the checks of phase 1 and the cut of
// phase 2. Pipeline stages are the outermost dimension of the mesh
// (strata::ParallelDims): with pp 2 on 4 ranks, ranks {0, 2} and {1, 3} are
// the two pipelines and {0, 1}, {2, 3} the stages' data-parallel groups.
#include "strata/recipes/app/run_checks.h"
#include "strata/recipes/app/tensor_parallel_run.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/pp/pipeline_parallel.h"

#include <memory>

namespace strata::recipes {

/// Phase 1: c10::ValueError (one line naming the value, exit 2) when `c`
/// asks for a pipeline this run cannot have: a size that does not divide the
/// world, an unknown schedule or one the micro-batches do not fit, or what
/// is not composed yet. Nothing when pp_size is 1. (Whether the model can be
/// cut into its stages, or --pp-split adds up, pipeline_layout() says.)
void check_pipeline_parallel(const RunConfig& c, const StrategyRegistry& registry, int world);

/// The stages' cuts of `module` under `c`'s --pp-size x --pp-virtual-stages
/// and --pp-split; c10::ValueError when it is no pp::PipelineModel or has
/// fewer blocks than stages.
std::vector<pp::StageCut> pipeline_cuts(const RunConfig& c, const TrainingModule& module);

/// Why `c`'s strategy (with its --offload and --activation-checkpointing)
/// does not compose with `c`'s pipeline yet; "" when it does ("auto": only
/// what no strategy composes with).
std::string pipeline_strategy_problem(const RunConfig& c, const StrategyRegistry& registry);

/// This rank's stage's ranks (its data-parallel ranks, times its tensor-
/// parallel ones, which apply_tensor_parallel splits off), and the pipeline
/// beside them (null when --pp-size is 1: then `strategy_comm` is `world`).
struct PipelineRun {
  Comm strategy_comm;
  std::shared_ptr<pp::PipelineParallel> pipeline;
};

/// The strategy's ModelParallel: the pipeline, the tensor-parallel ranks,
/// both (a ComposedParallel, stages outside), or null.
std::shared_ptr<ModelParallel> model_parallel(const PipelineRun& pipeline, const TensorParallelRun& dims);

/// Phase 2, on every rank (collective: splits `world`): `module` becomes
/// this rank's stages (a pp::StageModule owning the whole model, whose
/// parameters outside them are never materialised).
PipelineRun apply_pipeline_parallel(const RunConfig& c, const Comm& world, std::unique_ptr<TrainingModule>& module);

/// --dump-params and --export-weights under a pipeline (collective over it):
/// each stage's rank sends its parameters to rank 0, which writes the whole
/// model when `is_zero`.
void write_pipeline_exports(const CheckedRun& run, Strategy& strategy, pp::PipelineParallel& pipeline, bool is_zero);

}  // namespace strata::recipes
