#include "strata/recipes/app/planner.h"

#include "strata/core/training_module.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/trainer/memory.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>

namespace strata::recipes {
namespace {

/// Peak activation bytes of one training micro-step of `model` with `n_layer`
/// blocks: parameters and their gradients exist before it starts (gradients
/// allocated up front, as DDP's bucket views are), so the peak above that is
/// what the step itself allocates.
int64_t probe_step(const ModelConfig& model, int64_t n_layer, int64_t micro_batch, Precision precision,
                   bool checkpointed, const std::string& ac_policy) {
  MemoryTracker tracker;  // nested: restores the caller's allocator when done
  const ModelShape shape = model.shape();
  const auto owned = model.with_layers(n_layer)->build(/*deferred=*/false);
  TrainingModule& module = *owned;
  if (checkpointed) apply_activation_checkpointing(module, ActivationCheckpointOptions().every_n(1).policy(ac_policy));
  for (auto& p : module.module().parameters()) p.mutable_grad() = torch::zeros_like(p);
  auto gen = at::detail::createCPUGenerator(/*seed_val=*/0);
  const auto idx = torch::randint(shape.vocab_size, {micro_batch, shape.block_size}, gen,
                                  torch::TensorOptions(torch::kInt64));
  Batch batch{idx, idx.roll(-1, 1)};
  const int64_t base = tracker.current_bytes();
  tracker.reset_peak();
  {
    torch::Tensor loss;
    {
      AutocastGuard autocast(precision, c10::kCPU);
      loss = module.training_step(batch);
    }
    loss.backward();
  }
  return std::max<int64_t>(0, tracker.peak_bytes() - base);
}

}  // namespace

MemoryQuery memory_query(const StrategyRegistry& registry, const PlanRequest& r) {
  TORCH_CHECK_VALUE(r.world_size() >= 1, "memory planner: world size must be >= 1, got ", r.world_size());
  TORCH_CHECK_VALUE(r.optimizer() == "adamw" || r.optimizer() == "sgd", "memory planner: unknown optimizer '",
                    r.optimizer(), "'; known: adamw, sgd");
  MemoryQuery q;
  q.model = r.model()->size(r.tp_size());
  q.world_size = r.world_size();
  q.local_world_size = r.local_world_size() > 0 ? r.local_world_size() : r.world_size();
  q.optimizer_bytes_per_param = r.optimizer() == "adamw" ? 8 : r.momentum() > 0 ? 4 : 0;
  q.compute_bytes = compute_dtype(r.precision()) ? 2 : 4;
  q.offload = r.offload();
  q.micro_batches = r.accumulate_grad_batches();
  q.args = registry.spec(r.strategy()).parse_args(r.strategy_options());
  return q;
}

std::optional<CommEstimate> predict_comm(const StrategyRegistry& registry, const PlanRequest& r) {
  const StrategySpec& spec = registry.spec(r.strategy());
  if (!spec.communication()) return std::nullopt;
  auto c = spec.communication()(memory_query(registry, r));
  if (!c || r.tp_size() <= 1) return c;
  // Tensor parallelism's own bytes, over its group, beside the strategy's over its own.
  const auto b = r.model()->tensor_parallel_boundaries(r.micro_batch(), r.model()->shape().block_size,
                                                      r.activation_checkpointing());
  const auto tp = tp::communication(b, r.tp_size(), r.sequence_parallel(), compute_dtype(r.precision()) ? 2 : 4,
                                    r.accumulate_grad_batches());
  for (const auto& [kind, bytes] : tp.bytes) c->bytes[kind] += bytes;
  return c;
}

std::optional<MemoryEstimate> estimate_memory(const StrategyRegistry& registry, const PlanRequest& r) {
  const StrategySpec& spec = registry.spec(r.strategy());
  if (!spec.memory()) return std::nullopt;
  return spec.memory()(memory_query(registry, r));
}

bool plannable(const StrategyRegistry& registry, const PlanRequest& r) {
  const auto m = estimate_memory(registry, r);
  return m && m->predicts_peak;
}

ModelStatePrediction predict_model_state(const StrategyRegistry& registry, const PlanRequest& r) {
  const auto m = estimate_memory(registry, r);
  TORCH_CHECK_VALUE(m.has_value(), "memory planner: strategy '", r.strategy(),
                    "' has no memory model for these options");
  return {m->params, m->grads, m->optimizer};
}

ActivationProfile probe_activations(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                    const std::string& ac_policy) {
  TORCH_CHECK_VALUE(micro_batch >= 1, "memory planner: micro-batch must be >= 1, got ", micro_batch);
  // Why no grad mode changes or seeding: the probe builds its own modules and
  // draws its batch from its own generator; only the default generator is
  // advanced by the model's construction (phase 1, before the run seeds it).
  ActivationProfile a;
  validate(ActivationCheckpointOptions().policy(ac_policy));
  const int64_t one = probe_step(model, 1, micro_batch, precision, false, ac_policy);
  const int64_t two = probe_step(model, 2, micro_batch, precision, false, ac_policy);
  a.per_block = std::max<int64_t>(0, two - one);
  a.base = std::max<int64_t>(0, one - a.per_block);
  const int64_t one_ac = probe_step(model, 1, micro_batch, precision, true, ac_policy);
  const int64_t two_ac = probe_step(model, 2, micro_batch, precision, true, ac_policy);
  a.checkpointed_per_block = std::max<int64_t>(0, two_ac - one_ac);
  a.checkpointed_base = std::max<int64_t>(0, one_ac - a.checkpointed_per_block);
  a.measured = true;
  return a;
}

ActivationProfile estimate_activations(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                       const std::string& ac_policy) {
  return model.activation_formula(micro_batch, precision, ac_policy);
}

ActivationProfile activation_profile(const ModelConfig& model, int64_t micro_batch, Precision precision,
                                     const std::string& ac_policy, int64_t probe_limit_bytes) {
  // The probe's own footprint: two blocks and the embeddings, their gradients
  // (2 x 4 bytes each), and two blocks' activations and the head's.
  const auto estimate = estimate_activations(model, micro_batch, precision, ac_policy);
  const int64_t footprint = 8 * model.with_layers(2)->parameters() + estimate.total(2, 0);
  if (footprint > probe_limit_bytes) return estimate;
  return probe_activations(model, micro_batch, precision, ac_policy);
}

MemoryPrediction predict_peak(const StrategyRegistry& registry, const PlanRequest& r,
                              const ActivationProfile& activations) {
  const auto estimate = estimate_memory(registry, r);
  TORCH_CHECK_VALUE(estimate && estimate->predicts_peak, "memory planner: strategy '", r.strategy(),
                    "' has no peak model for these options");
  MemoryPrediction m;
  m.state = {estimate->params, estimate->grads, estimate->optimizer};
  m.gathered = estimate->gathered + estimate->held;
  m.activations = static_cast<int64_t>(double(activations.total(r.model()->shape().layers, r.activation_checkpointing())) *
                                       estimate->activation_scale *
                                       tp::activation_scale(r.tp_size(), r.sequence_parallel()));
  // Staging buffers live outside the activation phase: the peak holds the
  // larger of the two.
  m.overhead = kPlannerOverheadBytes + std::max<int64_t>(0, estimate->staging - m.activations);
  if (estimate->grads_freed_between_steps) {
    // The activation peak (the start of backward) meets no gradients; they
    // peak at the end of backward, when the activations are gone.
    m.activations = std::max<int64_t>(0, m.activations - std::min(m.activations, m.state.grads));
  }
  return m;
}

std::vector<PlanChoice> plan_variants(const StrategyRegistry& registry, const PlanRequest& base) {
  struct Candidate {
    const StrategySpec* spec;
    PlanVariant variant;
    int tp = 1;
  };
  std::vector<Candidate> variants;
  const int world = base.world_size();
  const int local = base.local_world_size() > 0 ? base.local_world_size() : world;
  for (const auto* spec : registry.specs()) {
    for (const auto& v : spec->plan()) {
      if (v.tensor_parallel && !spec->tensor_parallel()) continue;
      // Tensor-parallel groups stay inside a machine (tp::MeshDims).
      for (int tp = v.tensor_parallel ? 2 : 1; tp <= (v.tensor_parallel ? local : 1); ++tp) {
        if (local % tp != 0 || world % tp != 0) continue;
        if (tp > 1 && !base.model()->tensor_parallel_problem(tp, /*sequence_parallel=*/false).empty()) continue;
        const int data = world / tp;
        if (spec->max_world_size() > 0 && data > spec->max_world_size()) continue;
        if (data >= v.min_world_size) {
          variants.push_back({spec, v, tp});
          if (tp > 1) variants.back().variant.label += c10::str("+tp", tp);
        }
      }
    }
  }
  // The documented speed order (PlanVariant::speed_rank), fastest first;
  // among equals, less tensor parallelism first (less sent per token).
  std::stable_sort(variants.begin(), variants.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(a.variant.speed_rank, a.tp) < std::tie(b.variant.speed_rank, b.tp);
  });
  std::vector<PlanChoice> out;
  for (const auto& [spec, v, tp] : variants) {
    PlanRequest r = base;
    // A variant without recomputation keeps what the run asked for; each
    // strategy with its own defaults. Tensor parallelism splits the sequence
    // too where it can (less activation memory, the same bytes).
    // With tensor parallelism a group of T ranks takes T ranks' samples, so
    // the global batch stays the run's: T times the micro-batch (and its
    // activations: plan_candidates), split over the group.
    r.strategy(spec->name())
        .strategy_options({})
        .micro_batch(base.micro_batch() * tp)
        .activation_checkpointing(v.activation_checkpointing > 0 ? v.activation_checkpointing
                                                                 : base.activation_checkpointing())
        .offload(v.offload)
        .world_size(world / tp)
        .local_world_size(local / tp)
        .tp_size(tp)
        .sequence_parallel(tp > 1 && base.model()->tensor_parallel_problem(tp, true).empty());
    out.push_back({v.label, r, MemoryPrediction{}, false, v.exact});
  }
  return out;
}

std::vector<PlanChoice> plan_candidates(const StrategyRegistry& registry, const PlanRequest& base,
                                        const ActivationProfile& activations, int64_t budget_bytes) {
  std::vector<PlanChoice> out;
  for (PlanChoice& row : plan_variants(registry, base)) {
    if (!plannable(registry, row.request)) continue;
    // Activations probed at the run's micro-batch, scaled to a tensor-parallel group's.
    row.prediction = predict_peak(registry, row.request, scaled(activations, row.request.tp_size()));
    row.fits = row.prediction.peak() <= budget_bytes;
    out.push_back(std::move(row));
  }
  return out;
}


ActivationProfile scaled(ActivationProfile profile, int64_t factor) {
  for (int64_t* field : {&profile.per_block, &profile.base, &profile.checkpointed_per_block,
                         &profile.checkpointed_base}) {
    *field *= factor;
  }
  return profile;
}

std::optional<size_t> pick_fastest_fitting(const std::vector<PlanChoice>& candidates) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].fits && candidates[i].exact) return i;
  }
  return std::nullopt;
}

std::string fp32_alternative(const StrategyRegistry& registry, const PlanRequest& base,
                             const ActivationProfile& fp32_activations, int64_t budget_bytes, double slowdown) {
  PlanRequest fp32 = base;
  fp32.precision(Precision::kFp32);
  const auto rows = plan_candidates(registry, fp32, fp32_activations, budget_bytes);
  const auto pick = pick_fastest_fitting(rows);
  std::ostringstream line;
  line << "its matrix products run " << c10::str(std::round(slowdown * 10.0) / 10.0)
       << "x slower than fp32's on this CPU (measured); ";
  if (!pick) {
    line << "in fp32 nothing is predicted to fit " << format_bytes(budget_bytes)
         << " per rank, so the lower precision's memory is needed";
  } else {
    line << "in fp32 the planner picks " << rows[*pick].label << " (peak " << format_bytes(rows[*pick].prediction.peak())
         << " per rank, within " << format_bytes(budget_bytes) << "): --precision 32 trains faster here";
  }
  return line.str();
}

std::string format_plan_table(const std::vector<PlanChoice>& candidates, int64_t budget_bytes) {
  std::ostringstream out;
  char line[256];
  // A pipeline's rows are their fullest stage's (PlanChoice::peak_at).
  const bool where = std::any_of(candidates.begin(), candidates.end(), [](const auto& c) { return !c.peak_at.empty(); });
  std::snprintf(line, sizeof(line), "%-20s %14s %14s %14s %14s%s  %s\n", "strategy", "model state", "gathered",
                "activations", "peak/rank", where ? "  peak at  " : "", "fits?");
  out << line;
  for (const auto& c : candidates) {
    char at[32] = "";
    if (where) std::snprintf(at, sizeof(at), "  %-9s", c.peak_at.c_str());
    std::snprintf(line, sizeof(line), "%-20s %14s %14s %14s %14s%s  %s\n", c.label.c_str(),
                  format_bytes(c.prediction.state.total()).c_str(), format_bytes(c.prediction.gathered).c_str(),
                  format_bytes(c.prediction.activations).c_str(), format_bytes(c.prediction.peak()).c_str(), at,
                  !c.fits ? "no" : c.exact ? "yes" : "yes (never picked: it trains differently)");
    out << line;
  }
  out << "budget per rank: " << format_bytes(budget_bytes) << "\n";
  return out.str();
}

int64_t parse_byte_size(const std::string& text) {
  const auto bad = [&text]() {
    TORCH_CHECK_VALUE(false, "invalid byte size '", text,
                      "'; expected a positive number with an optional unit: B, K/KiB, M/MiB, G/GiB, T/TiB "
                      "(powers of 1024) or KB, MB, GB, TB (powers of 1000), e.g. 4GiB or 512MiB");
  };
  size_t pos = 0;
  while (pos < text.size() && (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) ++pos;
  if (pos == 0) bad();
  double value = 0.0;
  try {
    size_t used = 0;
    value = std::stod(text.substr(0, pos), &used);
    if (used != pos) bad();
  } catch (const std::logic_error&) {
    bad();
  }
  std::string unit = text.substr(pos);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0.0;
  if (unit.empty() || unit == "B") scale = 1.0;
  else if (unit == "K" || unit == "KIB") scale = 1024.0;
  else if (unit == "M" || unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else bad();
  const double bytes = value * scale;
  if (!(bytes >= 1.0) || bytes > 9.0e18) bad();
  return static_cast<int64_t>(bytes);
}

int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace strata::recipes
