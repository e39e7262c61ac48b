#include "strata/recipes/app/run.h"

#include "strata/callbacks/block_cache_trim.h"
#include "strata/callbacks/csv_logger.h"
#include "strata/callbacks/early_stopping.h"
#include "strata/callbacks/lr_monitor.h"
#include "strata/callbacks/memory_monitor.h"
#include "strata/callbacks/pipeline_bubble.h"
#include "strata/callbacks/model_checkpoint.h"
#include "strata/callbacks/profiler.h"
#include "strata/callbacks/progress.h"
#include "strata/callbacks/throughput.h"
#include "strata/core/atomic_file.h"
#include "strata/core/cuda_support.h"
#include "strata/core/device.h"
#include "strata/launch/environment.h"
#include "strata/launch/launcher.h"
#include "strata/recipes/app/dry_run.h"
#include "strata/recipes/app/gemm_ceiling.h"
#include "strata/recipes/app/flight_dumps.h"
#include "strata/recipes/app/peak_flops.h"
#include "strata/recipes/app/run_checks.h"
#include "strata/recipes/app/run_summary.h"
#include "strata/recipes/app/testing_aids.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/models/torchscript/torchscript.h"
#include "strata/recipes/app/pipeline_run.h"
#include "strata/recipes/app/tensor_parallel_run.h"
#include "strata/recipes/app/world.h"
#include "strata/strategies/activation_checkpoint.h"
#include "strata/strategies/process_group.h"

#include <nlohmann/json.hpp>

#include <malloc.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

namespace strata::recipes {
namespace fs = std::filesystem;

namespace {

/// Prints the strategy's partition / buckets once it is set up (rank 0).
class DescribeStrategy : public Callback {
 public:
  std::string name() const override { return "DescribeStrategy"; }
  void on_fit_start(Trainer& trainer, TrainingModule&) override {
    if (trainer.strategy().is_global_zero()) std::cout << trainer.strategy().describe() << std::endl;
  }
};

/// Records a training error for the launcher as soon as fit() sees it, before
/// unwinding tears down the process group: peers notice the closed connections
/// and fail right after, and the launcher names the earliest error first.
class RecordRankError : public Callback {
 public:
  std::string name() const override { return "RecordRankError"; }
  void on_exception(Trainer&, TrainingModule&, const std::exception& error) override {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
    record_rank_error(c10_error ? c10_error->what_without_backtrace() : error.what());
  }
};

void dump_params(const std::string& path, torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : module.named_parameters()) archive.write(item.key(), item.value());
  archive.save_to(path);
}

/// The module to train: the user's TorchScript model, or the model, deferred
/// for every strategy (one code path): the parameters get memory in the
/// strategy's setup, on its device, and the same values an eager build has;
/// FSDP builds one unit at a time, so a model that only fits sharded starts
/// at all. Sizes (num_params, FLOPs) count the logical model.
struct BuiltModule {
  std::unique_ptr<TrainingModule> module;
  TorchScriptModule* scripted = nullptr;
  int64_t n_params = 0;
};

BuiltModule build_module(CheckedRun& run) {
  const RunConfig& c = run.config;
  BuiltModule out;
  if (!c.torchscript.empty()) {
    auto loaded = std::make_unique<TorchScriptModule>(c.torchscript);
    out.scripted = loaded.get();
    out.n_params = loaded->num_params();
    out.module = std::move(loaded);
  } else {
    // --init-from's weights (checked in phase 1): a strategy's setup
    // materialises the deferred parameters and asks for each (FSDP: unit by
    // unit, into its flat buffers, or only its shards' parts when the source
    // serves them); LoRA adapters, which no file holds, keep the family's init.
    out.module = run.model->build(/*deferred=*/true, std::move(run.init_weights));
    out.n_params = run.model->parameters();
  }
  return out;
}

/// `pipeline`: null, or --pp-size's (each rank's measured bubble goes to pipeline.json).
std::vector<std::shared_ptr<Callback>> make_callbacks(const RunConfig& c, std::shared_ptr<Throughput> throughput,
                                                      const fs::path& out_dir, const MemoryTracker& memory,
                                                      std::shared_ptr<pp::PipelineParallel> pipeline) {
  std::vector<std::shared_ptr<Callback>> callbacks = {
      std::make_shared<RecordRankError>(),
      std::make_shared<DescribeStrategy>(),
      std::make_shared<ProgressBar>(
          ProgressBarOptions().mode(c.progress_bar ? ProgressMode::kAuto : ProgressMode::kPlain)),
      std::move(throughput),
      std::make_shared<MemoryMonitor>(),
      std::make_shared<LrMonitor>(),
  };
  if (c.checkpoint_every > 0 || !c.checkpoint_monitor.empty()) {
    callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions(checkpoints_dir(c))
            .every_n_train_steps(c.checkpoint_every)
            .keep_last(c.checkpoint_keep)
            .monitor(c.checkpoint_monitor)
            .mode(c.checkpoint_mode == "max" ? MonitorMode::kMax : MonitorMode::kMin)
            .save_top_k(c.checkpoint_keep_best)
            .async_write(c.checkpoint_async)));
  }
  if (pipeline) {
    callbacks.push_back(std::make_shared<PipelineBubble>(std::move(pipeline), (out_dir / "pipeline.json").string()));
  }
  if (c.early_stopping_patience > 0) {
    callbacks.push_back(
        std::make_shared<EarlyStopping>(EarlyStoppingOptions().patience(c.early_stopping_patience)));
  }
  if (const char* fail = std::getenv("STRATA_TEST_FAIL_AT_STEP")) {
    const char* fail_rank = std::getenv("STRATA_TEST_FAIL_RANK");
    callbacks.push_back(std::make_shared<FailAtStep>(std::atoll(fail), fail_rank ? std::atoi(fail_rank) : 0));
  }
  if (const char* kill = std::getenv("STRATA_TEST_KILL_AT_STEP")) {
    const char* kill_rank = std::getenv("STRATA_TEST_KILL_RANK");
    const char* once = std::getenv("STRATA_TEST_KILL_ONCE");
    callbacks.push_back(std::make_shared<KillAtStep>(std::atoll(kill), kill_rank ? std::atoi(kill_rank) : 0,
                                                     once ? once : ""));
  }
  if (c.debug_overflow_step > 0) callbacks.push_back(std::make_shared<OverflowAtStep>(c.debug_overflow_step));
  if (!c.profile.empty()) callbacks.push_back(std::make_shared<Profiler>(ProfilerOptions(c.profile)));
  if (memory.cache()) callbacks.push_back(std::make_shared<BlockCacheTrim>(memory.cache()));
  // Last, so it sees what the other callbacks logged for the step.
  callbacks.push_back(std::make_shared<CsvLogger>(CsvLoggerOptions(out_dir.string())));
  return callbacks;
}

/// This rank's Comm: the world's process group (one that can split into
/// subgroups, for FSDP's hybrid_shard), or none for a single process.
Comm make_comm(const RunConfig& c, const std::optional<DistEnv>& env, const torch::Device& device) {
  if (!env) return Comm(device);
  return join_world(*env, device, std::chrono::milliseconds(static_cast<int64_t>(c.comm_timeout_s * 1000)));
}

/// Activation checkpointing on the module this rank trains (its stages under
/// a pipeline); before the strategy's setup, so a strategy that wraps units
/// (FSDP) installs its layer outside: FSDP(checkpoint(block)).
void apply_checkpointing(const RunConfig& c, TrainingModule& module) {
  if (c.activation_checkpointing == 0) return;
  apply_activation_checkpointing(module, ActivationCheckpointOptions().every_n(c.activation_checkpointing).policy(c.ac_policy));
}

/// Files after training: --dump-params, --export-weights, --export-torchscript.
void write_exports(const CheckedRun& run, Strategy& strategy, BuiltModule& built, bool is_zero) {
  const RunConfig& c = run.config;
  if (!c.dump_params.empty()) {
    // A collective on every rank: FSDP gathers its shards into the full
    // parameters for as long as `full` lives.
    const auto full = strategy.full_params();
    if (is_zero) dump_params(c.dump_params, built.module->module());
  }
  if (!c.export_weights.empty() || !c.export_torchscript.empty()) {
    // A collective on every rank: FSDP gathers its shards into the full
    // parameters for as long as `full` lives; rank 0 writes (atomically).
    const auto full = strategy.full_params();
    if (is_zero && !c.export_weights.empty()) {
      run.model->write_weights(c.export_weights, named_parameters_of(built.module->module()),
                              run.model->weight_formats().front());
    }
    if (is_zero && built.scripted) built.scripted->save(c.export_torchscript);
  }
}

/// How this rank's model is split and the strategy that trains it.
struct RankParallel {
  PipelineRun pipeline;
  TensorParallelRun dims;
  std::shared_ptr<Strategy> strategy;
  int local_world = 1;  ///< the strategy's ranks per machine
};

/// --pp-size: this rank's stages of the model, the strategy over their
/// data-parallel group; --tp-size: the model split over its tensor-parallel
/// group, the strategy over the data-parallel one. Collective.
RankParallel make_parallel(const CheckedRun& run, const std::optional<DistEnv>& env, const StrategyRegistry& registry,
                           const Comm& comm, BuiltModule& built) {
  const RunConfig& c = run.config;
  PipelineRun pipeline = apply_pipeline_parallel(c, comm, built.module);
  apply_checkpointing(c, *built.module);
  TensorParallelRun dims = apply_tensor_parallel(c, pipeline.strategy_comm, *built.module);
  // Stages are outermost: a data-parallel group's ranks on this machine are
  // its tensor-parallel share of them, at most the group's size.
  const int local_world = std::max(1, std::min((env ? env->local_world_size : 1) / c.tp_size,
                                               comm.size() / (c.tp_size * c.pp_size)));
  auto strategy = registry.create_parsed(c.strategy, dims.strategy_comm, strategy_args(c, registry),
                                         strategy_context(c, dims.strategy_comm.size(), local_world, comm.device()));
  strategy->set_model_parallel(model_parallel(pipeline, dims));
  if (pipeline.pipeline) strategy->set_step_runner(pipeline.pipeline);
  return {std::move(pipeline), std::move(dims), std::move(strategy), local_world};
}

/// Phase 2, once the rank is in its world: the model, the strategy, fit().
void train_in_world(CheckedRun& run, const std::optional<DistEnv>& env, const StrategyRegistry& registry,
                    MemoryTracker& memory, Comm& comm) {
  const RunConfig& c = run.config;
  const torch::Device device = comm.device();
  const bool is_zero = comm.rank() == 0;
  const fs::path out_dir(c.output_dir);
  const std::string ini = to_ini(resolved_config(c, *run.model, at::get_num_threads()), run.model_keys, registry);
  if (is_zero) {
    const auto blas = check_blas_speed();
    if (blas.slow) std::cerr << blas.message << std::endl;
    // One process, or rank 0 of another launcher's job (strata's own launcher
    // warned before starting its ranks).
    if (speaks_for_machine(env) && device.is_cpu()) {
      const auto slow = half_precision_warning(at::get_num_threads(), c.precision, default_peak_flops_cache());
      if (!slow.empty()) std::cerr << slow << std::endl;
    }
    fs::create_directories(out_dir);
    // A stale summary from an earlier run must not make this one look
    // finished. --eval-only leaves a run's record alone (it writes eval.json).
    if (!c.eval_only) {
      fs::remove(out_dir / "summary.json");
      write_file_atomically((out_dir / "config.ini").string(), ini);
    }
  }
  torch::manual_seed(c.seed);
  BuiltModule built = build_module(run);
  const RankParallel parallel = make_parallel(run, env, registry, comm, built);
  const PipelineRun& pipeline = parallel.pipeline;
  const TensorParallelRun& dims = parallel.dims;
  const std::shared_ptr<Strategy>& strategy = parallel.strategy;
  const int local_world = parallel.local_world;
  const PeakFlops peak = mfu_peak(c.peak_flops, c.precision, device);
  // The job's GEMM-bound ceiling, tokens/s (CPU; rank 0 writes it; strata's
  // launcher measured the rate). Measured here on a cold cache, its matrices
  // are not the run's: the peak starts after them.
  const double ceiling = is_zero && device.is_cpu() && !built.scripted
                             ? gemm_ceiling_tokens_per_s(*run.model, c.batch_size, built.module->flops_per_token(),
                                                         c.precision, at::get_num_threads(),
                                                         default_peak_flops_cache()) * strategy->job_size()
                             : 0.0;
  memory.reset_peak();
  const auto matmul_dtype = compute_dtype(parse_precision(c.precision)).value_or(torch::kFloat32);
  auto throughput =
      std::make_shared<Throughput>(ThroughputOptions().peak_flops(peak.flops).peak_dtype(matmul_dtype));
  const auto callbacks = make_callbacks(c, throughput, out_dir, memory, pipeline.pipeline);
  if (is_zero) {
    std::cout << "strata-gpt | " << (built.scripted ? "torchscript " + c.torchscript : run.model_label) << " | "
              << built.n_params << " parameters | data " << run.data->name() << " | " << strategy->name() << " x "
              << comm.size() << " rank(s), " << at::get_num_threads() << " thread(s) each | device " << device
              << " | precision " << c.precision << "\n"
              << (dims.tensor_parallel ? dims.tensor_parallel->describe() + "\n" : "")
              << (pipeline.pipeline ? pipeline.pipeline->describe() + "\n" : "") << ini << std::flush;
  }
  // Testing aid: one more copy of the parameters' bytes, allocated through
  // the tracked allocator before the run so every rank's peak includes it.
  torch::Tensor extra_param_copy;
  if (c.debug_extra_param_copy) {
    extra_param_copy = torch::zeros({built.n_params}, torch::TensorOptions().device(device));
  }
  Trainer trainer(trainer_options(c), strategy, callbacks, &memory);
  if (c.eval_only) {
    const ValidationMetrics scored = trainer.evaluate(*built.module, *run.data);
    if (is_zero) write_eval_summary(run, scored);
    return;
  }
  const FitResult result = trainer.fit(*built.module, *run.data);
  if (pipeline.pipeline) {
    write_pipeline_exports(run, *strategy, *pipeline.pipeline, is_zero);
  } else {
    write_exports(run, *strategy, built, is_zero);
  }
  if (is_zero) {
    write_summary(run, registry, result, *strategy, *throughput, peak, built.n_params, device,
                  checkpoint_saves(callbacks), local_world, ceiling);
  }
}

/// Phase 2: one rank's training. Failures throw (exit 1), after the rank's
/// flight-recorder dump is written.
void train_rank(CheckedRun& run, const std::optional<DistEnv>& env, const StrategyRegistry& registry,
                MemoryTracker& memory, DumpSignal& dump_signal) {
  const RunConfig& c = run.config;
  configure_threads(c.threads_per_rank, env ? env->local_world_size : 1);
  const torch::Device device = resolve_device(c.device, env ? env->local_rank : 0);
  if (device.is_cuda()) {
    // Before the process group: NCCL binds each rank to the current device.
    set_cuda_device(device.index());
    memory.measure_device(device);
  }
  Comm comm = make_comm(c, env, device);
  configure_flight_recorder(comm, c.flight_recorder);
  apply_skip_collective_aid(comm);
  const auto dump = std::make_shared<const FlightDumpFile>(comm, fs::path(c.output_dir) / "flight");
  const DumpSignal::Action on_signal(dump_signal, [dump] { dump->write(); });
  const DumpOnTerminate on_terminate(dump);
  try {
    train_in_world(run, env, registry, memory, comm);
  } catch (...) {
    // Where this rank was, for the launcher's and strata-flight's diagnosis
    // (a comm timeout: the collective it waited in).
    dump->write();
    throw;
  }
}

}  // namespace

TrainerOptions trainer_options(const RunConfig& c) {
  return TrainerOptions()
      .max_steps(c.max_steps)
      .batch_size(c.batch_size)
      .accumulate_grad_batches(c.accumulate_grad_batches)
      .gradient_clip_val(c.gradient_clip_val)
      .log_every_n_steps(c.log_every_n_steps)
      .val_check_interval(c.val_check_interval)
      .limit_val_batches(c.limit_val_batches)
      .seed(c.seed)
      .precision(parse_precision(c.precision))
      .loss_scaler(LossScalerOptions()
                       .loss_scale(c.loss_scale)
                       .initial_scale_power(c.initial_scale_power)
                       .loss_scale_window(c.loss_scale_window)
                       .hysteresis(c.hysteresis)
                       .consecutive_hysteresis(c.consecutive_hysteresis)
                       .min_loss_scale(c.min_loss_scale))
      .optimizer(c.optimizer)
      .beta1(c.adam_beta1)
      .beta2(c.adam_beta2)
      .eps(c.adam_eps)
      .momentum(c.momentum)
      .nesterov(c.nesterov)
      .fused_adamw(c.fused_adamw)
      .fused_adamw_kernel(parse_fused_adamw_kernel(c.adamw_kernel))
      .lr(c.lr)
      .min_lr(std::min(c.min_lr, c.lr))
      .warmup_steps(c.warmup_steps)
      .weight_decay(c.weight_decay)
      .resume_from(c.resume)
      .checkpoint_format(c.checkpoint_format == "auto" ? "" : c.checkpoint_format);
}

namespace {
/// Phase 1 passed and this process is no rank: start this machine's ranks
/// (strata-gpt again, with the same arguments) and supervise them.
int launch_local_ranks(CheckedRun& run, const char* argv0) {
  const RunConfig& c = run.config;
  run.args[0] = self_executable(argv0);
  LaunchOptions launch;
  launch.nproc = c.nproc;
  launch.nnodes = c.nnodes;
  launch.node_rank = c.node_rank;
  launch.master_addr = c.master_addr;
  launch.master_port = c.master_port;
  launch.threads_per_rank = c.threads_per_rank;
  if (c.flight_recorder > 0) launch.flight_dir = (fs::path(c.output_dir) / "flight").string();
  // More ranks than cores runs, slowly (a correctness test may want it):
  // warned, not refused, once the input is known to be good.
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(c.nproc) > cores) {
    std::cerr << "warning: --nproc " << c.nproc << " is more than this machine's " << cores
              << " cores; the ranks will share them (slower, same results)" << std::endl;
  }
  try {
    // Measured (once per machine) before any rank runs: ranks measuring
    // side by side would each see part of the cores.
    if (resolve_device(c.device, 0).is_cpu()) {
      const int threads = resolve_threads(c.threads_per_rank, c.nproc);
      if (c.peak_flops == 0.0) cpu_peak_flops(threads, peak_dtype(c.precision), default_peak_flops_cache());
      if (c.torchscript.empty()) {  // the GEMM ceiling's rate, for the ranks to read
        cpu_gemm_rate(run.model->step_gemms(c.batch_size * run.model->shape().block_size), threads,
                      peak_dtype(c.precision), default_peak_flops_cache());
      }
      const auto slow = half_precision_warning(threads, c.precision, default_peak_flops_cache());
      if (!slow.empty()) std::cerr << slow << std::endl;
    }
    const int code = launch_ranks(run.args, launch);
    if (code != 0 && !launch.flight_dir.empty()) print_flight_report(launch.flight_dir);
    return code;
  } catch (const c10::Error& e) {  // e.g. fork failed: the ranks it started are stopped
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 1;
  }
}
}  // namespace

int run_gpt(int argc, char** argv) {
  StrategyRegistry registry;
  register_builtin_strategies(registry);
  return run_gpt(argc, argv, registry);
}

int run_gpt(int argc, char** argv, const StrategyRegistry& registry) {
  ModelRegistry models;
  register_builtin_models(models);
  return run_gpt(argc, argv, registry, models);
}

int run_gpt(int argc, char** argv, const StrategyRegistry& registry, const ModelRegistry& models) {
  // Why: glibc raises its mmap threshold each time a large block is freed,
  // after which freed tensors stay in the heap and peak RSS keeps every
  // transient buffer a run ever had (an offloaded run's staging, a
  // re-gathered unit) instead of what is alive. A fixed threshold returns
  // large blocks to the system when they are freed. What a step frees and
  // re-allocates every step does not pay for that with fresh pages: the
  // BlockCache under the tracker (--cpu-cache, trainer/block_cache.h) keeps
  // those, and frees the rest within a step. (A MALLOC_MMAP_THRESHOLD_ set by
  // the user wins.)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 20);

  // Why: stdout to a pipe or a file is block-buffered by default, so `| tee`
  // and CI logs would get the header, the config and the validation lines in
  // 4 KiB bursts. Line-buffered, each line leaves when it is written (every
  // rank is this binary, so the ranks' lines too). A terminal is line-buffered already.
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);

  std::vector<std::string> args(argv, argv + argc);
  ParseResult parsed = parse_run_config(args, cli_keys(models), registry);
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << std::endl;
    return parsed.exit_code;
  }
  // First, before any thread starts: the threads inherit SIGUSR1 blocked,
  // and the dump signal's own thread takes it (flight_dumps.h).
  DumpSignal dump_signal;
  // A dry run asks whether a configuration fits: it is not refused for this machine's memory.
  if (parsed.config->dry_run) parsed.config->no_memory_check = true;
  // Installed before any tensor of the run is made (parsing makes none).
  MemoryTracker memory(parsed.config->cpu_cache ? std::make_shared<BlockCache>() : nullptr);

  // ---- Phase 1: everything that can be wrong with the input; exit code 2. ----
  std::optional<DistEnv> env;
  CheckedRun run;
  try {
    // A launcher's variables are input too.
    env = dist_env_from(current_environment());
    run = check_run(*parsed.config, std::move(args), env, registry, models);
  } catch (const c10::Error& e) {
    // A rank that finds its input bad tells its launcher why (else the
    // launcher could only report "no error message").
    record_rank_error(e.what_without_backtrace());
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  }

  // Once per machine: by strata-gpt itself, not again by each rank it launches;
  // under another launcher by local rank 0.
  if (speaks_for_machine(env)) {
    for (const auto& note : run.config.config_notes) std::cerr << "note: " << note << std::endl;
  }

  if (run.config.dry_run) {
    if (env) {
      std::cerr << "error: --dry-run simulates every rank in one process; run it without a launcher (RANK "
                << env->rank << " is set)" << std::endl;
      return 2;
    }
    return run_dry(run, registry);
  }
  if (!env && (run.config.nproc > 1 || run.config.nnodes > 1)) return launch_local_ranks(run, argv[0]);

  // ---- Phase 2: train; failures exit 1 and are recorded for the launcher. ----
  const int rank = env ? env->rank : 0;
  try {
    train_rank(run, env, registry, memory, dump_signal);
    return 0;
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    record_rank_error(message);
    std::cerr << "[rank " << rank << "] error: " << message << std::endl;
    return 1;
  } catch (const std::exception& e) {
    record_rank_error(e.what());
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata::recipes
