#pragma once
// The memory planner's pipeline stages (issue 47): what one pipeline rank
// holds at its peak beside its model state, for `--dry-run` with --pp-size.
//
//   activations = max over the rank's schedule of what its micro-batches in
//                 flight keep (each forward run whose backward has not: its
//                 stage's blocks, and on the last stage the head's logits,
//                 log-softmax and final-norm input), plus one backward's
//                 working set on top (a block's on a stage without the head;
//                 the rest of the whole model's profile on the last)
//   held        = fsdp: the stage's full parameters (compute dtype) and full
//                 gradients (fp32), kept through the scheduled step
//                 (Strategy::begin_scheduled_step); ddp and single hold
//                 nothing beyond their model state
//
// The activations come from the whole model's profile (planner.h: per block
// and the rest), so a stage's are the same measurements cut by the schedule.
// docs/pipeline.md says how close this comes to real runs' peaks.
#include "strata/recipes/models/spec.h"
#include "strata/strategies/pp/schedule.h"
#include "strata/strategies/pp/stage_module.h"

#include <cstdint>
#include <vector>

namespace strata::recipes {

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

}  // namespace strata::recipes
