// The planner's pipeline stages (pipeline_plan.h).
#include "strata/recipes/app/pipeline_plan.h"

#include "strata/recipes/app/pipeline_run.h"
#include "strata/strategies/tp/spec.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>

namespace strata::recipes {

PipelineLayout pipeline_layout(const RunConfig& c, const ModelConfig& model) {
  PipelineLayout layout;
  layout.schedule = pp::make_schedule(c.pp_schedule, pp::ScheduleOptions()
                                                         .ranks(c.pp_size)
                                                         .microbatches(int(c.accumulate_grad_batches))
                                                         .virtual_stages(c.pp_virtual_stages));
  const auto whole = model.build(/*deferred=*/true);  // meta tensors: nothing allocated
  layout.cuts = pipeline_cuts(c, *whole);
  auto& stages = dynamic_cast<pp::PipelineModel&>(*whole);
  for (int rank = 0; rank < c.pp_size; ++rank) {
    // A rank runs stages rank, rank + P, ... (as apply_pipeline_parallel
    // holds them); a module two of them use (a tied embedding) counts once.
    ModelSize size;
    std::set<const void*> seen;
    for (int s = rank; s < int(layout.cuts.size()); s += c.pp_size) {
      for (const auto& [name, child] : stages.stage_children(layout.cuts[size_t(s)])) {
        for (const auto& p : child->parameters()) {
          if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
          size.params += p.numel();
          if (p.requires_grad()) size.trainable += p.numel();
        }
      }
    }
    layout.ranks.push_back(size);
    layout.held.push_back(describe_stages(layout.cuts, rank, c.pp_size));
  }
  return layout;
}

std::string describe_stages(const std::vector<pp::StageCut>& cuts, int rank, int ranks) {
  std::string out;
  for (int s = rank; s < int(cuts.size()); s += ranks) {
    const auto& cut = cuts[size_t(s)];
    out += c10::str(out.empty() ? "" : ", ", "stage ", s, ": blocks ", cut.blocks.first, "..", cut.blocks.second - 1,
                    cut.first ? " + embedding" : "", cut.last ? " + head" : "");
  }
  return out;
}

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

MemoryPrediction stage_peak(const ModelStatePrediction& state, const MemoryEstimate& estimate, int64_t activations) {
  MemoryPrediction m;
  m.state = state;
  m.gathered = estimate.gathered + estimate.held;
  m.activations = activations;
  // As predict_peak: staging buffers live outside the activation phase.
  m.overhead = kPlannerOverheadBytes + std::max<int64_t>(0, estimate.staging - activations);
  return m;
}

std::optional<std::vector<MemoryPrediction>> predict_stage_peaks(const StrategyRegistry& registry,
                                                                 const PlanRequest& request,
                                                                 const PipelineLayout& layout,
                                                                 const ActivationProfile& profile) {
  const auto& memory = registry.spec(request.strategy()).memory();
  if (!memory) return std::nullopt;
  MemoryQuery query = memory_query(registry, request);
  query.scheduled_step = true;
  const int64_t head = head_kept_bytes(request.model()->shape(), request.micro_batch(), query.compute_bytes);
  const double tp_scale = tp::activation_scale(request.tp_size(), request.sequence_parallel());
  std::vector<MemoryPrediction> out;
  for (int rank = 0; rank < int(layout.ranks.size()); ++rank) {
    query.model = layout.ranks[size_t(rank)];
    const auto estimate = memory(query);
    if (!estimate || !estimate->predicts_peak) return std::nullopt;
    const int64_t activations = static_cast<int64_t>(
        double(stage_activations(*layout.schedule, rank, layout.cuts, profile, request.activation_checkpointing(),
                                 head)) * tp_scale);
    out.push_back(stage_peak({estimate->params, estimate->grads, estimate->optimizer}, *estimate, activations));
  }
  return out;
}

std::vector<PlanChoice> plan_pipeline_candidates(const StrategyRegistry& registry, const PlanRequest& base,
                                                 const RunConfig& c, const PipelineLayout& layout,
                                                 const ActivationProfile& profile, int64_t budget_bytes) {
  std::vector<PlanChoice> out;
  for (PlanChoice& row : plan_variants(registry, base)) {
    if (row.request.tp_size() != base.tp_size()) continue;
    RunConfig candidate = c;
    candidate.strategy = row.request.strategy();
    candidate.offload = row.request.offload();
    candidate.activation_checkpointing = row.request.activation_checkpointing();
    if (!pipeline_strategy_problem(candidate, registry).empty()) continue;
    const auto peaks = predict_stage_peaks(registry, row.request, layout, profile);
    if (!peaks) continue;
    const auto fullest = std::max_element(peaks->begin(), peaks->end(), [](const auto& a, const auto& b) {
      return a.peak() < b.peak();
    });
    row.prediction = *fullest;
    row.peak_at = c10::str("pp rank ", fullest - peaks->begin());
    row.fits = row.prediction.peak() <= budget_bytes;
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace strata::recipes
