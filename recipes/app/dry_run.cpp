#include "strata/recipes/app/dry_run.h"

#include "strata/core/deferred_init.h"
#include "strata/recipes/app/pipeline_plan.h"
#include "strata/recipes/app/planner.h"
#include "strata/recipes/app/run.h"
#include "strata/recipes/app/pipeline_run.h"
#include "strata/recipes/app/tensor_parallel_run.h"
#include "strata/recipes/models/spec.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/fake_world.h"
#include "strata/strategies/tp/spec.h"
#include "strata/trainer/trainer.h"

#include <c10/util/StringUtil.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

namespace strata::recipes {

namespace {

constexpr int kSteps = 2;  // the second is measured: the first creates the optimizer state

/// Nothing to initialise: the parameters stay on the meta device, where a
/// strategy's setup "materialises" them (whole: FSDP runs its broadcasts,
/// as a run without --init-from does).
class LeaveOnMeta : public ParameterSource {
 public:
  bool has(const std::string&) const override { return true; }
  void read(const std::string&, int64_t, int64_t, const torch::Tensor&) const override {}
};

CommBytes difference(const CommBytes& after, const CommBytes& before) {
  CommBytes d;
  for (size_t k = 0; k < d.sent.size(); ++k) {
    d.sent[k] = after.sent[k] - before.sent[k];
    d.calls[k] = after.calls[k] - before.calls[k];
  }
  return d;
}

/// One optimizer step as Trainer::run_step makes it, on meta tensors: the
/// strategy's step runner (the Trainer's code) and every strategy call after
/// it, in order, with the trainer's flight-recorder phases.
void simulate_step(Strategy& strategy, TrainingModule& module, torch::optim::Optimizer& optimizer,
                   const TrainerOptions& options, const Batch& batch, int64_t step, ModelStateBytes* state) {
  const Comm& comm = strategy.comm();
  auto phase = [&](const char* what) { comm.set_flight_phase(c10::str("step ", step, " ", what)); };
  StepContext context;
  context.hooks.phase = phase;
  MicroBatchTimes times;
  strategy.step_runner().forward_backward(strategy, module, std::vector<Batch>(size_t(options.accumulate_grad_batches()), batch),
                                          context, times);
  phase("gradient sync");
  strategy.reduce_gradients();
  strategy.step_runner().after_gradient_sync(strategy);
  phase("optimizer");
  strategy.clip_grad_norm(options.gradient_clip_val(), 1.0);
  strategy.optimizer_step(optimizer);
  if (state != nullptr) *state = strategy.model_state_bytes(optimizer);
  strategy.zero_grad(optimizer);
  phase("loss");
  strategy.mean_over_ranks(0.0);
}

/// Ranks 0 and the last; under a pipeline each stage's first rank instead
/// (a stage's ranks hold alike), so every stage's memory is shown.
std::vector<int> simulated_ranks(int world, int pp) {
  if (world == 1) return {0};
  if (pp == 1) return {0, world - 1};
  std::vector<int> ranks;
  for (int s = 0; s < pp; ++s) ranks.push_back(s * (world / pp));
  return ranks;
}

/// " (pipeline 8 x data-parallel 16 x tensor-parallel 8, 16 micro-batches)"; "" for data parallelism alone.
std::string mesh_of(const RunConfig& c, int world) {
  if (c.pp_size == 1 && c.tp_size == 1) return "";
  const int dp = world / (c.pp_size * c.tp_size);
  if (c.pp_size == 1) return c10::str(" (", dp, " data-parallel x tensor-parallel ", c.tp_size, ")");
  return c10::str(" (pipeline ", c.pp_size, " x data-parallel ", dp,
                  c.tp_size > 1 ? c10::str(" x tensor-parallel ", c.tp_size) : std::string(), ", ",
                  c.accumulate_grad_batches, " micro-batches)");
}

}  // namespace

DryRunRank simulate_rank(const CheckedRun& run, const StrategyRegistry& registry, int rank, int world) {
  link_meta_kernels();
  const RunConfig& c = run.config;
  const torch::Device meta(torch::kMeta);
  Comm comm(fake_process_group(rank, world), meta, fake_subgroup_factory());
  // Room for every collective of setup and both steps (a per-parameter ddp
  // bucketing of a large model issues thousands a step).
  comm.set_flight_recorder(std::make_shared<FlightRecorder>(size_t{1} << 20));
  torch::manual_seed(c.seed);
  std::unique_ptr<TrainingModule> owned = run.model->build(/*deferred=*/true, std::make_shared<LeaveOnMeta>());
  // --pp-size and --tp-size: the real cut, split and groups (fake subgroups),
  // as run.cpp makes them.
  const PipelineRun pipeline = apply_pipeline_parallel(c, comm, owned);
  TrainingModule& module = *owned;
  if (c.activation_checkpointing > 0) {
    apply_activation_checkpointing(module, ActivationCheckpointOptions().every_n(c.activation_checkpointing).policy(c.ac_policy));
  }
  const TensorParallelRun dims = apply_tensor_parallel(c, pipeline.strategy_comm, module);
  const int local_world = std::max(1, std::min(std::min(world, c.nproc) / c.tp_size, world / (c.tp_size * c.pp_size)));
  auto strategy = registry.create_parsed(c.strategy, dims.strategy_comm, strategy_args(c, registry),
                                         strategy_context(c, dims.strategy_comm.size(), local_world, meta));
  strategy->set_model_parallel(model_parallel(pipeline, dims));
  if (pipeline.pipeline) strategy->set_step_runner(pipeline.pipeline);
  DryRunRank out;
  for (const auto& p : module.module().parameters()) {
    // Whole (tp parts), before a sharding strategy's setup cuts them.
    out.stage_params += p.numel();
    if (p.requires_grad()) out.stage_trainable += p.numel();
  }
  // strata's fused AdamW is CPU code; torch's AdamW keeps the same state.
  const TrainerOptions options = trainer_options(c).fused_adamw(false);
  comm.set_flight_phase("setup");
  strategy->setup(module);
  auto optimizer =
      strategy->setup_optimizer(make_optimizer_groups(module.module(), options), optimizer_factory(options));
  module.module().train();
  const auto ids = torch::empty({c.batch_size, run.model->shape().block_size}, torch::TensorOptions(torch::kLong).device(meta));
  const Batch batch{ids, ids};
  out.rank = rank;
  out.n_params = run.model->parameters();
  out.layout = strategy->describe();
  if (dims.tensor_parallel) out.layout.append(1, '\n').append(dims.tensor_parallel->describe());
  if (pipeline.pipeline) {
    out.layout.append(1, '\n').append(pipeline.pipeline->describe());
    const auto& stages = dynamic_cast<const pp::StageModule&>(module);
    out.pp_rank = pipeline.pipeline->group().rank();
    out.cuts = stages.cuts();
    out.stages = describe_stages(out.cuts, out.pp_rank, c.pp_size);
  }
  CommBytes before;
  for (int64_t step = 1; step <= kSteps; ++step) {
    before = comm.bytes();
    simulate_step(*strategy, module, *optimizer, options, batch, step, step == 1 ? &out.state : nullptr);
  }
  out.per_step = difference(comm.bytes(), before);
  const std::string measured = c10::str("step ", kSteps, " ");
  for (const auto& r : comm.flight_recorder()->records()) {
    if (r.label.rfind(measured, 0) == 0) out.step_collectives.push_back(r);
  }
  return out;
}

namespace {

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

/// A pipeline rank's peak (pipeline_plan.h): its simulated model state, what
/// its strategy's memory model says it holds through the scheduled step
/// (MemoryQuery::scheduled_step: fsdp's whole stage), and its stages'
/// activations; nullopt for a strategy that does not model a stage.
std::optional<MemoryPrediction> plan_stage(const StrategyRegistry& registry, MemoryQuery query, const RunConfig& c,
                                           const ModelConfig& model, const DryRunRank& r,
                                           const ActivationProfile& profile) {
  query.model = ModelSize{r.stage_params, r.stage_trainable, 0, 0, 0};
  query.scheduled_step = true;
  const auto& memory = registry.spec(c.strategy).memory();
  const auto estimate = memory ? memory(query) : std::nullopt;
  if (!estimate || !estimate->predicts_peak) return std::nullopt;
  const auto schedule = pp::make_schedule(c.pp_schedule, pp::ScheduleOptions()
                                                              .ranks(c.pp_size)
                                                              .microbatches(int(c.accumulate_grad_batches))
                                                              .virtual_stages(c.pp_virtual_stages));
  const int64_t head = head_kept_bytes(model.shape(), c.batch_size, query.compute_bytes);
  const auto activations = static_cast<int64_t>(
      double(stage_activations(*schedule, r.pp_rank, r.cuts, profile, c.activation_checkpointing, head)) *
      tp::activation_scale(c.tp_size, c.sequence_parallel));
  return stage_peak({r.state.params, r.state.grads, r.state.optimizer}, *estimate, activations);
}

void print_memory(const std::vector<DryRunRank>& ranks, const std::optional<ModelStatePrediction>& formula,
                  const std::vector<std::optional<MemoryPrediction>>& planned) {
  // `formula`: the strategy's memory model (its spec), as the planner asks it.
  std::cout << "\nmemory per rank, MiB | params | grads | optimizer | model state | planner: activations | planner: peak\n";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const auto& r = ranks[i];
    const auto& p = planned[i];
    std::cout << "rank " << r.rank << (r.stages.empty() ? "" : " (" + r.stages + ")") << " | " << mib(r.state.params)
              << " | " << mib(r.state.grads) << " | " << mib(r.state.optimizer) << " | " << mib(r.state.total())
              << " | " << (p ? mib(p->activations) : "n/a") << " | " << (p ? mib(p->peak()) : "n/a") << "\n";
  }
  if (formula) {
    std::cout << "the strategy's memory model | " << mib(formula->params) << " | " << mib(formula->grads) << " | "
              << mib(formula->optimizer) << " | " << mib(formula->total()) << " | |\n";
  }
  // Exact lines, one per rank: what a test compares with a real run's summary.json.
  for (size_t i = 0; i < ranks.size(); ++i) {
    const auto& r = ranks[i];
    std::cout << "model state bytes, rank " << r.rank << ": params=" << r.state.params << " grads=" << r.state.grads
              << " optimizer=" << r.state.optimizer << "\n";
    if (planned[i]) {
      std::cout << "planner peak bytes, rank " << r.rank << ": activations=" << planned[i]->activations
                << " peak=" << planned[i]->peak() << "\n";
    }
  }
}

void print_collectives(const DryRunRank& r) {
  std::cout << "\ncollectives of one step, rank " << r.rank << " (" << r.step_collectives.size()
            << "), in the order issued:\n";
  for (const auto& c : r.step_collectives) {
    std::cout << "  #" << c.seq << " " << c.group << " " << c.op << " " << c.dtype << " " << c.bytes << " B  ["
              << c.label << "]\n";
  }
  // One line, exact integers: what a test compares with a real run's
  // summary.json (per_rank[].comm_bytes_per_step).
  std::cout << "bytes sent per step, rank " << r.rank << ":";
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    if (r.per_step.calls[k] == 0) continue;
    std::cout << " " << collective_name(static_cast<CollectiveKind>(k)) << "=" << r.per_step.sent[k];
  }
  std::cout << " total=" << r.per_step.total_sent() << "\n";
}

int simulate_and_print(const CheckedRun& run, const StrategyRegistry& registry) {
  const RunConfig& c = run.config;
  // Not simulated yet: offload moves real bytes between tiers, and a
  // TorchScript model is not a registered model the dry run builds.
  if (c.offload != "none" || !c.torchscript.empty()) {
    std::cerr << "error: --dry-run simulates strata's models without --offload and --torchscript; got "
              << (c.offload != "none" ? "--offload " + c.offload : "--torchscript " + c.torchscript) << std::endl;
    return 2;
  }
  const int world = c.nproc * c.nnodes;
  const auto start = std::chrono::steady_clock::now();
  std::vector<DryRunRank> ranks;
  for (int rank : simulated_ranks(world, c.pp_size)) ranks.push_back(simulate_rank(run, registry, rank, world));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto request = plan_request(c, run.model, world / (c.tp_size * c.pp_size), c.nproc / c.tp_size);
  const auto profile = [&] { return activation_profile(*run.model, c.batch_size, parse_precision(c.precision), c.ac_policy); };
  std::optional<ModelStatePrediction> formula;
  std::vector<std::optional<MemoryPrediction>> planned(ranks.size());
  if (c.pp_size > 1) {
    // Each stage's own: its simulated state, its schedule's activations.
    const auto whole = profile();
    const MemoryQuery query = memory_query(registry, request);
    for (size_t i = 0; i < ranks.size(); ++i) planned[i] = plan_stage(registry, query, c, *run.model, ranks[i], whole);
  } else if (plannable(registry, request)) {
    const auto planner = predict_peak(registry, request, profile());
    formula = planner.state;
    for (auto& p : planned) p = planner;
  }
  std::cout << "strata-gpt --dry-run | " << run.model_label << " | " << ranks.front().n_params << " parameters | "
            << c.strategy << " x " << world << " ranks"
            << mesh_of(c, world)
            << " | micro-batch " << c.batch_size << " x block "
            << run.model->shape().block_size << " | precision " << c.precision << "\n"
            << "a fake process group and meta tensors: the strategy's real setup and " << kSteps
            << " real steps, no data, no memory; " << ranks.size() << " rank(s) simulated in "
            << c10::str(std::round(seconds * 100) / 100) << " s\n\n"
            << "rank 0's layout:\n"
            << ranks.front().layout << "\n";
  print_memory(ranks, formula, planned);
  print_collectives(ranks.front());
  if (ranks.size() > 1) print_collectives(ranks.back());
  return 0;
}

}  // namespace

int run_dry(const CheckedRun& run, const StrategyRegistry& registry) {
  try {
    return simulate_and_print(run, registry);
  } catch (const c10::Error& e) {
    std::cerr << "error: --dry-run: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: --dry-run: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata::recipes
