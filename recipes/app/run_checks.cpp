#include "strata/recipes/app/run_checks.h"
#include "strata/recipes/app/memory_checks.h"
#include "strata/recipes/app/run_data.h"

#include "strata/recipes/app/pipeline_plan.h"
#include "strata/recipes/app/pipeline_run.h"
#include "strata/recipes/app/tensor_parallel_run.h"
#include "strata/recipes/app/peak_flops.h"


#include "strata/core/atomic_file.h"
#include "strata/core/cuda_support.h"
#include "strata/core/device.h"
#include "strata/launch/launcher.h"
#include "strata/recipes/data/data.h"
#include "strata/recipes/app/output_dir.h"
#include "strata/recipes/app/run.h"
#include "strata/recipes/config/cli_rules.h"
#include "strata/recipes/models/torchscript/torchscript.h"
#include "strata/strategies/offload_tier.h"
#include "strata/callbacks/model_checkpoint.h"
#include "strata/trainer/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

namespace strata::recipes {
namespace fs = std::filesystem;

namespace {

/// A rank re-reads its launcher's command line: strata's own launcher passes
/// --nproc (ranks per machine) and --nnodes on, and they must agree with the
/// world it set up. Under another launcher, leave them out.
void check_world(const RunConfig& c, const std::optional<DistEnv>& env, const StrategyRegistry& registry) {
  TORCH_CHECK_VALUE(!env || c.nproc == 1 || c.nproc == env->local_world_size, "--nproc ", c.nproc,
                    " disagrees with LOCAL_WORLD_SIZE ", env->local_world_size,
                    " set by the launcher; omit --nproc when joining an existing world");
  TORCH_CHECK_VALUE(!env || c.nnodes == 1 || c.nnodes * c.nproc == env->world_size, "--nnodes ", c.nnodes,
                    " x --nproc ", c.nproc, " disagrees with WORLD_SIZE ", env->world_size,
                    " set by the launcher; omit --nnodes when joining an existing world");
  if (registry.contains(c.strategy)) {
    const int most = registry.spec(c.strategy).max_world_size();
    // With --tp-size the strategy runs over one data-parallel group.
    if (most > 0 && world_shape(c, env).data > most) {
      std::string several;
      for (const auto* spec : registry.specs()) {
        if (spec->max_world_size() == 0) several += (several.empty() ? "" : ", ") + spec->name();
      }
      TORCH_CHECK_VALUE(false, "strategy '", c.strategy, "' runs at most ", most, " process(es) but the world has ",
                        world_shape(c, env).world, " (--nproc ", c.nproc, " x --nnodes ", c.nnodes,
                        "); use one of ", several, " for several ranks");
    }
  }
  // Every local rank must find its device: check the highest LOCAL_RANK now.
  resolve_device(c.device, env ? env->local_rank : c.nproc - 1);
  // strata's own launcher keeps its rendezvous files in TMPDIR.
  if (!env && (c.nproc > 1 || c.nnodes > 1)) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string dir = tmp && *tmp ? tmp : "/tmp";
    const std::string problem = directory_write_problem(dir);
    TORCH_CHECK_VALUE(problem.empty(), "TMPDIR '", dir, "' cannot hold the launcher's rendezvous files (", problem,
                      "); set TMPDIR to a writable directory");
  }
}

/// DeepSpeed's train_batch_size = micro-batch x accumulation x world: the
/// one of the first two not given is derived from it (DeepSpeed's rule: with
/// neither, accumulation 1), and all three must agree (DeepSpeed refuses
/// them otherwise too).
void derive_global_batch(RunConfig& c, int64_t world) {
  const int64_t global = c.config_global_batch;
  auto derive = [&](int64_t per, const char* what) {
    TORCH_CHECK_VALUE(global % per == 0, "--config: train_batch_size ", global, " is not a multiple of ", what,
                      " = ", per, "; make them agree (or set train_batch_size to \"auto\")");
    return global / per;
  };
  if (!c.batch_size_given && !c.accumulate_given) c.accumulate_grad_batches = 1;
  if (!c.batch_size_given) {
    c.batch_size = derive(c.accumulate_grad_batches * world, "accumulation x world");
  } else if (!c.accumulate_given) {
    c.accumulate_grad_batches = derive(c.batch_size * world, "micro-batch x world");
  }
  const int64_t got = c.batch_size * c.accumulate_grad_batches * world;
  TORCH_CHECK_VALUE(got == global, "--config: train_batch_size ", global, " != micro-batch ", c.batch_size,
                    " x accumulation ", c.accumulate_grad_batches, " x world ", world, " = ", got,
                    "; make them agree (or set train_batch_size to \"auto\")");
}

/// What a DeepSpeed / Accelerate --config asked that depends on the world and
/// the device: train_batch_size (derive_global_batch); an offload to host
/// memory on a CPU device, whose state is already there, offloads nothing
/// (said in a note) where --offload cpu given directly is refused.
void check_foreign_config(RunConfig& c, const std::optional<DistEnv>& env) {
  const auto shape = world_shape(c, env);
  if (c.config_global_batch > 0) derive_global_batch(c, shape.data);
  if (c.offload == "cpu" && c.offload_host_from_config && resolve_device(c.device, shape.local_rank).is_cpu()) {
    c.offload = "none";
    c.config_notes.push_back("--config offloads to cpu (host memory), where a CPU device's state already is: "
                             "nothing is offloaded");
  }
}

/// Exit-2 error unless `path` can be written at the end of training: its
/// directory exists and is writable, and `path` is not a directory.
void check_output_file(const std::string& flag, const std::string& path) {
  const std::string problem = output_file_problem(path);
  TORCH_CHECK_VALUE(problem.empty(), "cannot write --", flag, " '", path, "': ", problem);
}

/// Exit-2 errors for a TorchScript model whose logits do not fit the data:
/// one forward (eval mode, no grad) on a held-out sample must give [1, T, V]
/// with V >= the data's vocabulary.
void check_torchscript_model(TorchScriptModule& model, const DataSource& data, const std::string& path) {
  torch::NoGradGuard no_grad;
  model.module().eval();
  const Batch batch = data.val_batch(0, 1, ShardInfo{});
  torch::Tensor logits;
  try {
    logits = model.forward(batch.input);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "TorchScript model '", path, "' fails on a batch of token ids ", batch.input.sizes(),
                      ": ", e.what_without_backtrace());
  }
  TORCH_CHECK_VALUE(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == batch.input.size(1) &&
                        logits.size(2) >= data.vocab_size(),
                    "TorchScript model '", path, "' returns logits ", logits.sizes(), " for token ids ",
                    batch.input.sizes(), "; expected [1, ", batch.input.size(1), ", V] with V >= ",
                    data.vocab_size(), " (the data's vocabulary)");
}

/// The model's inputs: --init-from's weights, --torchscript's model and
/// --resume's checkpoint, each checked against the model (and the data).
void check_model_inputs(CheckedRun& run) {
  const RunConfig& c = run.config;
  // Resuming, --init-from's directory gives the model and the checkpoint its weights.
  if (!c.init_from.empty() && c.resume.empty()) run.init_weights = run.model->read_weights(c.init_from);
  if (!c.torchscript.empty()) {
    TorchScriptModule probe(c.torchscript);
    check_torchscript_model(probe, *run.data, c.torchscript);
    if (!c.resume.empty()) check_resume_matches(c.resume, probe.module(), c.optimizer);
  } else if (!c.resume.empty()) {
    const auto shape_only = run.model->build(/*deferred=*/true);  // names and shapes, no memory
    check_resume_matches(c.resume, shape_only->module(), c.optimizer);
  }
}

/// What is written during or after training, outside --output-dir: the
/// exports and --profile's traces (DIR is created when the trace is saved).
void check_late_outputs(const RunConfig& c, const ModelConfig& model) {
  if (!c.export_weights.empty()) {
    const auto formats = model.weight_formats();
    const std::string problem = model.export_problem(c.export_weights, formats.empty() ? "" : formats.front());
    TORCH_CHECK_VALUE(problem.empty(), problem);
    check_output_file("export-weights", c.export_weights);
  }
  if (!c.export_torchscript.empty()) check_output_file("export-torchscript", c.export_torchscript);
  if (!c.profile.empty()) {
    std::error_code ec;
    const bool exists = fs::is_directory(c.profile, ec);
    check_output_file("profile", exists ? (fs::path(c.profile) / "trace-rank0.json").string() : c.profile);
  }
}

/// Exit-2 errors for a disk-offload directory that is missing, not writable,
/// or too small for the offloaded state of `local_ranks` ranks, each holding
/// `bytes_per_rank`. When the directory is the output directory, which may
/// not exist yet, the space is checked where it will be created
/// (check_output_dir checks that it can be).
void check_offload_dir(const RunConfig& config, int64_t bytes_per_rank, int local_ranks) {
  fs::path dir = offload_dir_of(config);
  if (config.offload_dir.empty()) {
    std::error_code ec;
    dir = fs::absolute(dir, ec);
    while (!dir.empty() && !fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
  } else {
    const auto problem = disk_tier_problem(dir.string());
    TORCH_CHECK_VALUE(problem.empty(), problem);
  }
  const int64_t needed = bytes_per_rank * local_ranks;
  const int64_t free = free_bytes_at(dir.string());
  TORCH_CHECK_VALUE(free >= needed, "cannot use --offload-dir '", offload_dir_of(config), "': it has ",
                    format_bytes(free), " free, but the offloaded state of ", local_ranks, " rank(s) needs ",
                    format_bytes(needed));
}

/// The strategy's own checks with the world, the device and --offload
/// (StrategySpec::check: fsdp's hybrid node size and offload rules, the
/// others' offload), and the room a disk offload needs.
void check_strategy_options(const CheckedRun& run, const StrategyRegistry& registry,
                            const std::optional<DistEnv>& env) {
  const RunConfig& c = run.config;
  if (!registry.contains(c.strategy)) return;
  const auto shape = world_shape(c, env);
  // The strategy's ranks per machine: a tensor-parallel group's share of them.
  const auto context = strategy_context(c, shape.data, std::max(1, std::min(shape.local_ranks / c.tp_size, shape.data)),
                                        resolve_device(c.device, shape.local_rank));
  const std::string problem = registry.spec(c.strategy).check_run(strategy_args(c, registry), context);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  // Once per machine (its launcher, or its local rank 0, which the other
  // ranks cannot overtake: setup's collectives wait for it): the directory
  // must take the offload files of this machine's ranks, each the bytes its
  // strategy's memory model says it keeps in the tier. (Sized for the model:
  // a --torchscript model's size is not checked.)
  if (c.offload == "disk" && c.torchscript.empty() && shape.local_rank == 0) {
    const auto estimate = estimate_memory(registry, plan_request(c, run.model, shape.data, shape.local_ranks / std::max(1, c.tp_size)));
    if (estimate) check_offload_dir(c, estimate->offloaded, shape.local_ranks);
  }
}

}  // namespace

WorldShape world_shape(const RunConfig& c, const std::optional<DistEnv>& env) {
  // The strategy's ranks: those of one tensor-parallel rank and one stage.
  const int split = std::max(1, c.tp_size) * std::max(1, c.pp_size);
  if (env) return {env->world_size, env->local_world_size, env->local_rank, env->world_size / split};
  return {c.nproc * c.nnodes, c.nproc, 0, c.nproc * c.nnodes / split};
}


PlanRequest plan_request(const RunConfig& c, const ModelPtr& model, int world, int local_world) {
  return PlanRequest(model, c.strategy == "auto" ? std::string() : c.strategy, world)
      .strategy_options(c.strategy_options)
      .local_world_size(local_world)
      .micro_batch(c.batch_size)
      .tp_size(c.tp_size)
      .sequence_parallel(c.sequence_parallel)
      .precision(parse_precision(c.precision))
      .activation_checkpointing(c.activation_checkpointing)
      .offload(c.offload)
      .optimizer(c.optimizer)
      .momentum(c.momentum)
      .accumulate_grad_batches(c.accumulate_grad_batches);
}

StrategyContext strategy_context(const RunConfig& c, int world, int local_world, const torch::Device& device) {
  StrategyContext context;
  context.world_size = world;
  context.local_world_size = local_world;
  context.device = device;
  context.precision = parse_precision(c.precision);
  context.offload = c.offload;
  context.offload_dir = offload_dir_of(c);
  return context;
}

std::string offload_dir_of(const RunConfig& config) {
  return config.offload_dir.empty() ? config.output_dir : config.offload_dir;
}

ModelRequest model_request(const RunConfig& c, int64_t vocab_size, int64_t block_size) {
  ModelRequest r;
  r.preset = c.given_keys.count("preset") != 0 ? c.preset : "";
  r.default_preset = c.preset;
  r.options = c.model_options;
  r.init_from = c.init_from;
  r.init_adapter = c.init_adapter;
  r.vocab_size = vocab_size;
  r.block_size = block_size;
  return r;
}

namespace {
/// Records the family and the registered model keys it does not read
/// (config.ini comments those out).
void record_model_keys(RunConfig& config, const ModelConfig& model, const ModelKeys& keys) {
  config.model_family = model.family();
  for (const auto& key : model.source_keys()) config.model_source_keys.insert(key);
  for (const ModelKey& key : keys.options) {
    if (std::find(key.families.begin(), key.families.end(), model.family()) == key.families.end()) {
      config.model_unread.insert(key.option.key());
    }
  }
}
}  // namespace

bool speaks_for_machine(const std::optional<DistEnv>& env) {
  return !env || (env->local_rank == 0 && std::getenv("STRATA_ERROR_FILE") == nullptr);
}

CheckedRun check_run(RunConfig config, std::vector<std::string> args, const std::optional<DistEnv>& env,
                     const StrategyRegistry& registry, const ModelRegistry& models) {
  CheckedRun run;
  config.resume = resolve_resume(config, &config.config_notes);
  check_world(config, env, registry);
  check_resume_position(config, world_shape(config, env).data);
  check_foreign_config(config, env);
  // Known shapes first; the data itself (a tokenization that writes a cache)
  // only once the checks below have passed.
  RunData data = RunData::plan(config);
  const ModelRequest request = model_request(config, data.vocab_size(), data.block_size());
  run.model = models.resolve(request);
  // The directory that gave the model, or the preset (given, or the default one).
  run.model_label = !run.model->source_directory().empty() ? request.init_from
                    : request.preset.empty()                ? request.default_preset
                                                            : request.preset;
  run.model_keys = cli_keys(models);
  record_model_keys(config, *run.model, run.model_keys);
  run.config = std::move(config);
  run.args = std::move(args);
  trainer_options(run.config);  // its own checks
  if (!run.config.torchscript.empty()) run.data = data.open(env);  // its probe reads a batch
  check_model_inputs(run);
  const auto shape = world_shape(run.config, env);
  check_tensor_parallel(run.config, *run.model, registry, shape.world, shape.local_ranks);
  check_pipeline_parallel(run.config, registry, shape.world);
  if (run.config.pp_size > 1) run.pipeline = std::make_shared<const PipelineLayout>(pipeline_layout(run.config, *run.model));
  // --eval-only writes eval.json and nothing else: a recorded run's exports are not made again.
  if (!run.config.eval_only) check_late_outputs(run.config, *run.model);
  std::optional<ActivationProfile> profile;
  if (run.config.strategy == "auto") profile = choose_strategy(run, env, registry);
  check_memory(run, registry, env, profile);
  check_strategy_options(run, registry, env);
  if (!run.data) run.data = data.open(env);
  // Last, and only where rank 0's outputs will be written (the launcher of
  // node 0, or rank 0 itself): an output directory that cannot be created is
  // bad input, reported before any rank starts. Other nodes' launchers write
  // nothing there, and a dry run nothing at all.
  if ((env ? env->rank == 0 : run.config.node_rank == 0) && !run.config.dry_run) {
    check_output_dir(run.config.output_dir);
  }
  return run;
}

}  // namespace strata::recipes
