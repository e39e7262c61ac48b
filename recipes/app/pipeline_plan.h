#pragma once
// The memory planner's pipeline stages (issue 47): what one pipeline rank
// holds at its peak, for `--dry-run`, `--strategy auto`, the pre-flight check
// and summary.json's predictions with --pp-size.
//
//   state       = the strategy's memory model asked for the rank's stages
//                 (their parameters over the stage's data-parallel ranks),
//                 or a dry run's simulated state
//   held        = what the strategy holds through the scheduled step
//                 (MemoryQuery::scheduled_step: fsdp its full stage)
//   activations = max over the rank's schedule of what its micro-batches in
//                 flight keep (each forward run whose backward has not: its
//                 stage's blocks, and on the last stage the head's logits,
//                 log-softmax and final-norm input), plus one backward's
//                 working set on top (a block's on a stage without the head;
//                 the rest of the whole model's profile on the last)
//   overhead    = the planner's constant, or the strategy's staging buffers
//                 when they outgrow the activations (oss, sdp)
//
// The activations come from the whole model's profile (planner.h: per block
// and the rest), so a stage's are the same measurements cut by the schedule.
// docs/pipeline.md says how close this comes to real runs' peaks.
//
// Example (strata-gpt --strategy auto --pp-size 2):
//   const auto layout = pipeline_layout(config, *model);
//   auto rows = plan_pipeline_candidates(registry, request, config, layout, profile, budget);
#include "strata/recipes/app/planner.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/pp/schedule.h"
#include "strata/strategies/pp/stage_module.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace strata::recipes {

/// A run's pipeline as the planner sees it: its schedule, every stage's cut,
/// and what each pipeline rank holds.
struct PipelineLayout {
  std::shared_ptr<const pp::Schedule> schedule;
  std::vector<pp::StageCut> cuts;
  /// Per pipeline rank: its stages' parameters (a tied weight once per
  /// rank), whole, before tensor parallelism splits them.
  std::vector<ModelSize> ranks;
  /// Per pipeline rank: "stage 0: blocks 0..3 + embedding".
  std::vector<std::string> held;
};

/// `c`'s --pp-size, --pp-schedule, --pp-virtual-stages and --pp-split over
/// `model`, built on meta tensors (nothing allocated). Throws
/// c10::ValueError as check_pipeline_parallel does for a model that cannot
/// be cut so.
PipelineLayout pipeline_layout(const RunConfig& c, const ModelConfig& model);

/// Pipeline rank r's stages, as the dry run and the run's log name them.
std::string describe_stages(const std::vector<pp::StageCut>& cuts, int rank, int ranks);

/// What the last stage keeps per micro-batch for its head's backward: the
/// logits' log-softmax (fp32, [B, T, V]) and the inputs of the final norm
/// and the head ([B, T, C] each, in the compute dtype).
int64_t head_kept_bytes(const ModelShape& shape, int64_t micro_batch, int64_t compute_bytes);

/// Pipeline rank `rank`'s activations at its peak under `schedule`, its
/// stages cut by `cuts` (every stage's), from the whole model's `profile`
/// with every `checkpoint_every`-th block checkpointed (0: none); `head`:
/// head_kept_bytes.
int64_t stage_activations(const pp::Schedule& schedule, int rank, const std::vector<pp::StageCut>& cuts,
                          const ActivationProfile& profile, int64_t checkpoint_every, int64_t head);

/// A pipeline rank's peak (the file comment): `state`, and from `estimate`
/// (its strategy's memory model under a scheduled step) what it holds and
/// stages; `activations` already scaled for tensor parallelism.
MemoryPrediction stage_peak(const ModelStatePrediction& state, const MemoryEstimate& estimate, int64_t activations);

/// Every pipeline rank's peak when `request`'s strategy runs over one
/// stage's data-parallel ranks (request.world_size()); nullopt when its
/// memory model has no peak for a stage (MemoryEstimate::predicts_peak).
std::optional<std::vector<MemoryPrediction>> predict_stage_peaks(const StrategyRegistry& registry,
                                                                 const PlanRequest& request,
                                                                 const PipelineLayout& layout,
                                                                 const ActivationProfile& profile);

/// `--strategy auto` under --pp-size: plan_candidates' variants over a
/// stage's data-parallel ranks that a pipeline composes with (no tensor-
/// parallel ones: --tp-size stays the run's; none check_pipeline_parallel
/// refuses), each row's prediction that of its fullest pipeline rank
/// (PlanChoice::peak_at names it).
std::vector<PlanChoice> plan_pipeline_candidates(const StrategyRegistry& registry, const PlanRequest& base,
                                                 const RunConfig& c, const PipelineLayout& layout,
                                                 const ActivationProfile& profile, int64_t budget_bytes);

}  // namespace strata::recipes
