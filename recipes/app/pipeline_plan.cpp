// The planner's pipeline stages (pipeline_plan.h).
#include "strata/recipes/app/pipeline_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace strata::recipes {

int64_t head_kept_bytes(const ModelShape& shape, int64_t micro_batch, int64_t compute_bytes) {
  const int64_t tokens = micro_batch * shape.block_size;
  return tokens * (4 * shape.vocab_size + 2 * compute_bytes * shape.width);
}

int64_t stage_activations(const pp::Schedule& schedule, int rank, const std::vector<pp::StageCut>& cuts,
                          const ActivationProfile& profile, int64_t checkpoint_every, int64_t head) {
  TORCH_CHECK_VALUE(int(cuts.size()) == schedule.stages(), "stage_activations: ", cuts.size(), " cuts for a ",
                    schedule.stages(), "-stage schedule");
  TORCH_CHECK_VALUE(rank >= 0 && rank < schedule.ranks(), "stage_activations: rank ", rank, " of ", schedule.ranks());
  // What one micro-batch keeps in a stage: its blocks' share of the profile
  // (checkpointed ones keep their input only), and the head's on the last.
  const int64_t rest = profile.total(0, checkpoint_every);
  auto kept = [&](int stage) {
    const auto& cut = cuts[size_t(stage)];
    const int64_t blocks = cut.blocks.second - cut.blocks.first;
    return profile.total(blocks, checkpoint_every) - rest + (cut.last ? head : 0);
  };
  int64_t held = 0, most = 0;
  for (const pp::Action& a : schedule.actions()[size_t(rank)]) {
    if (a.op == pp::Op::Forward) held += kept(a.stage);
    most = std::max(most, held);
    // A split backward's I keeps the stage's graph for its W (strata's W
    // walks it again): the activations go with W.
    if (a.op == pp::Op::Backward || a.op == pp::Op::BackwardWeight) held -= kept(a.stage);
  }
  // One backward's working set on top of what is kept: a block's whole
  // activations (its recompute under checkpointing) where no head runs; on
  // the last stage the rest of the whole model's peak beyond what the head
  // keeps (the loss's gradient, the logits' gradient).
  const bool last = schedule.rank_of(schedule.stages() - 1) == rank;
  const int64_t working = last ? std::max<int64_t>(0, rest - head) : profile.per_block;
  return most + working;
}

}  // namespace strata::recipes
