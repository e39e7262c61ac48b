#include "strata/recipes/app/pipeline_run.h"

#include "strata/core/device.h"
#include "strata/strategies/composed_parallel.h"
#include "strata/strategies/parallel_dims.h"

#include <torch/serialize.h>

#include <c10/util/Exception.h>

namespace strata::recipes {

std::vector<pp::StageCut> pipeline_cuts(const RunConfig& c, const TrainingModule& module) {
  const auto* model = dynamic_cast<const pp::PipelineModel*>(&module);
  TORCH_CHECK_VALUE(model != nullptr, "--pp-size ", c.pp_size, ": this model cannot be cut into pipeline stages yet "
                    "(strata's GPT can)");
  const int stages = c.pp_size * c.pp_virtual_stages;
  TORCH_CHECK_VALUE(model->pipeline_blocks() >= stages, "--pp-size ", c.pp_size, " x --pp-virtual-stages ",
                    c.pp_virtual_stages, " needs ", stages, " blocks, one per stage at least; the model has ",
                    model->pipeline_blocks(), " block(s)");
  return pp::stage_cuts(*model, stages, c.pp_split);
}

std::string pipeline_strategy_problem(const RunConfig& c, const StrategyRegistry& registry) {
  // Every strategy runs over a stage's data-parallel ranks. FSDP keeps a
  // stage's units gathered through the schedule; its offloaded shards are not
  // (the tied weight's sum adds into the gradients in memory).
  const bool fsdp = c.strategy != "auto" && registry.spec(c.strategy).name() == "fsdp";  // or its alias
  if (fsdp && c.offload != "none") {
    return c10::str("--pp-size ", c.pp_size, " with --strategy fsdp and --offload ", c.offload, ": offloaded shards "
                    "under a pipeline are not composed yet; use --offload none, or --strategy sdp or oss with --offload");
  }
  // Zero-bubble's split backward walks a checkpointed block's recompute in
  // both halves when a block that is not checkpointed comes before it: its
  // weights' gradients would be added twice.
  if (c.activation_checkpointing > 0 && (c.pp_schedule == "zero-bubble" || c.pp_schedule == "ZBH1")) {
    return c10::str("--pp-schedule ", c.pp_schedule, " with --activation-checkpointing ", c.activation_checkpointing,
                    ": the split backward does not compose with checkpointed blocks yet; use 1f1b, gpipe or "
                    "interleaved-1f1b");
  }
  return "";
}

void check_pipeline_parallel(const RunConfig& c, const StrategyRegistry& registry, int world) {
  if (c.pp_size == 1) {
    TORCH_CHECK_VALUE(c.pp_virtual_stages == 1 && c.pp_split.empty(), "--pp-virtual-stages and --pp-split cut "
                      "pipeline stages; they need --pp-size > 1 (got --pp-size 1)");
    return;
  }
  TORCH_CHECK_VALUE(world % (c.pp_size * c.tp_size) == 0, "--pp-size ", c.pp_size, c.tp_size > 1 ? c10::str(
                    " x --tp-size ", c.tp_size) : std::string(), " does not divide the world of ", world, " ranks");
  // Not composed yet (issue 47): each is one line rather than a wrong run.
  // (--strategy auto chooses among the strategies that compose: pipeline_plan.h.)
  const std::string problem = pipeline_strategy_problem(c, registry);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  TORCH_CHECK_VALUE(c.torchscript.empty(), "--pp-size ", c.pp_size, " cuts a registered model into stages; a "
                    "--torchscript model has none");
  // The executor's lanes order the sends and receives as NCCL needs
  // (executor.h), but no machine with two GPUs has run a pipeline yet: one
  // line rather than an untried run.
  TORCH_CHECK_VALUE(resolve_device(c.device, 0).is_cpu(), "--pp-size ", c.pp_size, " runs on CPU ranks (Gloo) only "
                    "for now: a pipeline has not been run on GPUs yet; use --device cpu");
  // 16-mixed needs nothing more: every stage's rank scales by the same loss
  // scale, and the skip decision reads the global norm, summed over the
  // stages, so every rank skips the same steps and its scale moves alike.
  // The schedule's own checks (its name, micro-batches a multiple of the
  // ranks for interleaved-1f1b), made now with the run's numbers.
  pp::make_schedule(c.pp_schedule, pp::ScheduleOptions()
                                       .ranks(c.pp_size)
                                       .microbatches(int(c.accumulate_grad_batches))
                                       .virtual_stages(c.pp_virtual_stages));
  // The cut itself: pipeline_layout(), which check_run calls next.
}

PipelineRun apply_pipeline_parallel(const RunConfig& c, const Comm& world, std::unique_ptr<TrainingModule>& module) {
  if (c.pp_size == 1) return {world, nullptr};
  const auto mesh = strata::ParallelDims::of(world.size(), ParallelSizes().pp(c.pp_size).tp(c.tp_size));
  // Collective: every rank makes the same two splits in the same order.
  Comm pp_group = world.split("pp", mesh.groups({Dim::pp}));
  // The stage's ranks: its data-parallel ones, and inside them its tensor-
  // parallel ones, which apply_tensor_parallel splits off (innermost).
  Comm stage_group = world.split(c.tp_size > 1 ? "stage" : "dp", mesh.groups({Dim::dp_replicate, Dim::dp_shard, Dim::tp}));
  const auto cuts = pipeline_cuts(c, *module);
  std::vector<int> held;
  for (int s = pp_group.rank(); s < int(cuts.size()); s += c.pp_size) held.push_back(s);
  auto stages = std::make_unique<pp::StageModule>(std::move(module), cuts, held);
  auto pipeline = std::make_shared<pp::PipelineParallel>(
      world, pp_group, *stages, pp::PipelineOptions().schedule(c.pp_schedule).virtual_stages(c.pp_virtual_stages));
  module = std::move(stages);
  return {stage_group, pipeline};
}

std::shared_ptr<ModelParallel> model_parallel(const PipelineRun& pipeline, const TensorParallelRun& dims) {
  if (pipeline.pipeline && dims.tensor_parallel) {
    return std::make_shared<ComposedParallel>(
        std::vector<std::shared_ptr<ModelParallel>>{pipeline.pipeline, dims.tensor_parallel});
  }
  if (pipeline.pipeline) return pipeline.pipeline;
  return dims.tensor_parallel;
}

/// --dump-params and --export-weights under a pipeline: each stage's rank
/// sends its parameters to rank 0, which writes the whole model.
void write_pipeline_exports(const CheckedRun& run, Strategy& strategy, pp::PipelineParallel& pipeline, bool is_zero) {
  const RunConfig& c = run.config;
  if (c.dump_params.empty() && c.export_weights.empty()) return;
  // Collective over the stage's data-parallel group (fsdp gathers its units).
  const auto full = strategy.full_params();
  const auto gathered = pipeline.gather_parameters();  // collective over the pipeline
  if (!is_zero) return;
  if (!c.dump_params.empty()) {
    torch::serialize::OutputArchive archive;
    for (const auto& [name, value] : gathered) archive.write(name, value);
    archive.save_to(c.dump_params);
  }
  if (!c.export_weights.empty()) {
    run.model->write_weights(c.export_weights, NamedTensors(gathered.begin(), gathered.end()),
                             run.model->weight_formats().front());
  }
}

}  // namespace strata::recipes
