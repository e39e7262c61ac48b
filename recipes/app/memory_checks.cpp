// strata-gpt's --strategy auto and pre-flight memory check (memory_checks.h).
#include "strata/recipes/app/memory_checks.h"

#include "strata/core/cuda_support.h"
#include "strata/core/device.h"
#include "strata/recipes/app/peak_flops.h"
#include "strata/recipes/app/pipeline_plan.h"
#include "strata/recipes/app/run.h"
#include "strata/recipes/app/tensor_parallel_run.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <numeric>

namespace strata::recipes {
namespace {

/// The strategy's ranks per machine: a tensor-parallel group's share of
/// them, at most a stage's.
int strategy_local_ranks(const RunConfig& c, const WorldShape& shape) {
  return std::max(1, std::min(shape.local_ranks / std::max(1, c.tp_size), shape.data));
}

/// args without `--key value` / `--key=value` for each of `keys`, then
/// `--key value` for each of `set`: how the launcher hands its ranks the
/// strategy --strategy auto chose (the command line wins over --config).
std::vector<std::string> rewrite_args(const std::vector<std::string>& args, const std::vector<std::string>& keys,
                                      const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool dropped = false;
    for (const auto& key : keys) {
      if (args[i] == "--" + key) {
        ++i;  // its value
        dropped = true;
        break;
      }
      if (args[i].rfind("--" + key + "=", 0) == 0) {
        dropped = true;
        break;
      }
    }
    if (!dropped) out.push_back(args[i]);
  }
  for (const auto& [key, value] : set) {
    out.push_back("--" + key);
    out.push_back(value);
  }
  return out;
}

/// args without the bool flag `--key` (bare, `--key true|false` or `--key=...`).
std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& key) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--" + key + "=", 0) == 0) continue;
    if (args[i] == "--" + key) {
      if (i + 1 < args.size() && (args[i + 1] == "true" || args[i + 1] == "false")) ++i;
      continue;
    }
    out.push_back(args[i]);
  }
  return out;
}

/// Issue 35: bf16 on a CPU without bf16 instructions trains ~10x slower than
/// fp32; --strategy auto says whether fp32 would fit the same budget.
void print_fp32_alternative(const RunConfig& c, const ModelConfig& model, const PlanRequest& base,
                            const StrategyRegistry& registry, int64_t budget, int local_ranks) {
  const double slowdown =
      half_precision_slowdown(resolve_threads(c.threads_per_rank, local_ranks), c.precision, default_peak_flops_cache());
  if (slowdown == 0.0) return;
  const auto profile = activation_profile(model, c.batch_size, Precision::kFp32, c.ac_policy);
  std::cout << "--precision " << c.precision << ": " << fp32_alternative(registry, base, profile, budget, slowdown)
            << std::endl;
}

/// The candidates predicted to fit `budget` per rank, for the pre-flight
/// check's message: over the whole job (tensor parallelism among them) at
/// the run's global batch, or with a `layout` over a stage's ranks.
std::string what_fits(const CheckedRun& run, const StrategyRegistry& registry, const WorldShape& shape,
                      const PipelineLayout* layout, const ActivationProfile& profile, int64_t budget) {
  const RunConfig& c = run.config;
  std::vector<PlanChoice> rows;
  if (layout) {
    rows = plan_pipeline_candidates(registry, plan_request(c, run.model, shape.data, strategy_local_ranks(c, shape)),
                                    c, *layout, profile, budget);
  } else {
    // A tensor-parallel run's --batch-size is a group's, shared by its T
    // ranks (rounded up when T does not divide it).
    const int tp = std::max(1, c.tp_size);
    const auto job = plan_request(c, run.model, shape.world, shape.local_ranks)
                         .tp_size(1)
                         .sequence_parallel(false)
                         .micro_batch((c.batch_size + tp - 1) / tp);
    rows = plan_candidates(registry, job, profile, budget);
  }
  std::string fitting;
  for (const auto& row : rows) {
    if (row.fits) {
      fitting += (fitting.empty() ? "" : ", ") + row.label + " (" + format_bytes(row.prediction.peak()) +
                 (row.exact ? "" : "; trains differently, --strategy auto never picks it") + ")";
    }
  }
  return fitting.empty() ? std::string("nothing at this batch size") : fitting;
}

/// The peaks of this machine's ranks (node `node` of `shape`) under
/// `request`: each its pipeline stage's with a `layout`; nullopt when its
/// strategy has no peak model.
std::optional<std::vector<int64_t>> machine_peaks(const StrategyRegistry& registry, const PlanRequest& request,
                                                  const PipelineLayout* layout, const ActivationProfile& profile,
                                                  const WorldShape& shape, int node) {
  if (!layout) {
    if (!plannable(registry, request)) return std::nullopt;
    return std::vector<int64_t>(size_t(shape.local_ranks), predict_peak(registry, request, profile).peak());
  }
  const auto stages = predict_stage_peaks(registry, request, *layout, profile);
  if (!stages) return std::nullopt;
  // Stages are the mesh's outermost dimension: world rank g runs stage
  // g / (world / pp).
  const int per_stage = shape.world / int(stages->size());
  std::vector<int64_t> out;
  for (int l = 0; l < shape.local_ranks; ++l) {
    out.push_back((*stages)[size_t((node * shape.local_ranks + l) / per_stage)].peak());
  }
  return out;
}

}  // namespace

/// --strategy auto (memory_checks.h).
ActivationProfile choose_strategy(CheckedRun& run, const std::optional<DistEnv>& env, const StrategyRegistry& registry) {
  RunConfig& c = run.config;
  // The planner models strata's models: a --torchscript model is not planned.
  TORCH_CHECK_VALUE(c.torchscript.empty(),
                    "--strategy auto plans strata's registered models; with --torchscript name the strategy");
  // Ranks of strata's own launcher never see "auto" (it passes them the
  // choice); ranks of another launcher each decide, and must agree: a budget
  // from MemAvailable would differ between them.
  TORCH_CHECK_VALUE(!env || !c.memory_budget.empty(),
                    "--strategy auto under an external launcher needs --memory-budget (every rank must "
                    "make the same choice; available memory differs between them)");
  const auto shape = world_shape(c, env);
  const auto device = resolve_device(c.device, shape.local_rank);
  const int64_t budget = !c.memory_budget.empty() ? parse_byte_size(c.memory_budget)
                         : device.is_cuda()       ? cuda_total_memory_bytes(device.index())
                                                  : available_memory_bytes() / std::max(1, shape.local_ranks);
  auto profile = activation_profile(*run.model, c.batch_size, parse_precision(c.precision), c.ac_policy);
  PlanRequest base = plan_request(c, run.model, shape.data, strategy_local_ranks(c, shape));
  // With --pp-size: the strategies over a stage's ranks, each rank's stages predicted.
  const PipelineLayout* layout = run.pipeline.get();
  const auto rows = layout ? plan_pipeline_candidates(registry, base, c, *layout, profile, budget)
                           : plan_candidates(registry, base, profile, budget);
  const std::string table = format_plan_table(rows, budget);
  const auto pick = pick_fastest_fitting(rows);
  TORCH_CHECK_VALUE(pick.has_value(), "--strategy auto: no strategy is predicted to fit ", format_bytes(budget),
                    " per rank (", shape.world, " rank(s), batch ", c.batch_size, "):\n", table);
  const auto& chosen = rows[*pick];
  if (!env || env->rank == 0) {
    std::cout << "strata-gpt --strategy auto: per-rank peak predicted for " << run.model_label << ", " << shape.world
              << " rank(s), batch " << c.batch_size << " x block " << run.model->shape().block_size << ", precision "
              << c.precision << " (" << (profile.measured ? "activations probed" : "activations by formula")
              << ")\n"
              << table << "chosen: " << chosen.label << " (the fastest predicted to fit; order: ";
    for (size_t i = 0; i < rows.size(); ++i) std::cout << (i > 0 ? ", " : "") << rows[i].label;
    std::cout << ")" << std::endl;
    if (layout) {
      std::cout << "pipeline: " << c.pp_size << " stages (" << c.pp_schedule << ", " << c.accumulate_grad_batches
                << " micro-batches), the chosen strategy over each stage's " << shape.data << " rank(s);";
      for (size_t r = 0; r < layout->held.size(); ++r) std::cout << " pp rank " << r << ": " << layout->held[r] << ";";
      std::cout << std::endl;
    } else if (device.is_cpu()) {
      print_fp32_alternative(c, *run.model, base, registry, budget, shape.local_ranks);
    }
    if (chosen.request.tp_size() > 1) {
      std::cout << "tensor parallel: groups of " << chosen.request.tp_size() << " ranks"
                << (chosen.request.sequence_parallel() ? " with sequence parallelism" : "") << ", each taking "
                << chosen.request.micro_batch() << " samples per micro-batch (--batch-size), so the global batch "
                << "stays " << c.batch_size * shape.world << std::endl;
    }
  }
  c.strategy = chosen.request.strategy();
  c.strategy_options.clear();  // auto takes none: the chosen strategy's defaults
  c.activation_checkpointing = chosen.request.activation_checkpointing();
  c.offload = chosen.request.offload();
  c.memory_budget.clear();
  run.args = rewrite_args(run.args, {"strategy", "activation-checkpointing", "offload", "memory-budget"},
                          {{"strategy", c.strategy},
                           {"activation-checkpointing", std::to_string(c.activation_checkpointing)},
                           {"offload", c.offload}});  // every strategy takes --offload (sdp+offload-disk)
  if (chosen.request.tp_size() > 1) {
    // Tensor parallelism: each group takes its ranks' samples (the global batch stays).
    c.tp_size = chosen.request.tp_size();
    c.sequence_parallel = chosen.request.sequence_parallel();
    c.batch_size = chosen.request.micro_batch();
    run.args = without_flag(rewrite_args(run.args, {"batch-size", "tp-size"},
                                         {{"batch-size", std::to_string(c.batch_size)},
                                          {"tp-size", std::to_string(c.tp_size)}}),
                            "sequence-parallel");
    run.args.push_back(c.sequence_parallel ? "--sequence-parallel=true" : "--sequence-parallel=false");
    check_tensor_parallel(c, *run.model, registry, shape.world, shape.local_ranks);
    return scaled(profile, c.tp_size);  // probed at the run's micro-batch, now T times larger
  }
  return profile;
}

/// The pre-flight memory check (memory_checks.h).
void check_memory(const CheckedRun& run, const StrategyRegistry& registry, const std::optional<DistEnv>& env,
                  std::optional<ActivationProfile> profile) {
  const RunConfig& c = run.config;
  // Once per machine, before any rank starts.
  const auto shape = world_shape(c, env);
  if (c.no_memory_check || !c.torchscript.empty() || !speaks_for_machine(env) || !resolve_device(c.device, 0).is_cpu()) {
    return;
  }
  const auto request = plan_request(c, run.model, shape.data, strategy_local_ranks(c, shape));
  const PipelineLayout* layout = run.pipeline.get();
  const int node = env ? env->rank / std::max(1, env->local_world_size) : c.node_rank;
  const auto start = std::chrono::steady_clock::now();
  const int64_t available = available_memory_bytes();
  // Fast path: when model state alone (no activations) cannot fit, refuse
  // without probing (building even two blocks of a large model takes
  // seconds); the list of what would fit then uses the formula.
  const auto state_only = machine_peaks(registry, request, layout, {}, shape, node);
  if (!state_only) return;  // no peak model for this strategy and its options
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
  const bool hopeless = available > 0 && sum(*state_only) > available;
  const auto precision = parse_precision(c.precision);
  if (!profile) {
    profile = hopeless ? estimate_activations(*run.model, c.batch_size, precision, c.ac_policy)
                       : activation_profile(*run.model, c.batch_size, precision, c.ac_policy);
  }
  const auto peaks = *machine_peaks(registry, request, layout, *profile, shape, node);
  const int64_t total = sum(peaks), peak = *std::max_element(peaks.begin(), peaks.end());
  if (available <= 0 || total <= available) return;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.2f", took);
  TORCH_CHECK_VALUE(false, "pre-flight memory check: ", c.strategy, " x ", shape.local_ranks, " local rank(s) of ",
                    c.preset, " at batch ", c.batch_size, layout ? c10::str(" in ", c.pp_size, " pipeline stages") : "",
                    " is predicted to peak at ", format_bytes(peak), " per rank", layout ? " (the fullest stage's)" : "",
                    ", ", format_bytes(total), " in all, but this machine has ", format_bytes(available),
                    " available; predicted to fit: ", what_fits(run, registry, shape, layout,
                                                                 *profile, available / shape.local_ranks),
                    " (checked in ", seconds, " s; --no-memory-check skips this check)");
}

}  // namespace strata::recipes
