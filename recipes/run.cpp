#include "recipes/run.h"

#include "callbacks/csv_logger.h"
#include "callbacks/early_stopping.h"
#include "callbacks/lr_monitor.h"
#include "callbacks/memory_monitor.h"
#include "callbacks/model_checkpoint.h"
#include "callbacks/progress.h"
#include "callbacks/throughput.h"
#include "core/atomic_file.h"
#include "core/cuda_support.h"
#include "core/device.h"
#include "launch/environment.h"
#include "launch/launcher.h"
#include "recipes/data.h"
#include "recipes/gpt.h"
#include "recipes/output_dir.h"
#include "strategies/activation_checkpoint.h"
#include "strategies/fsdp/hybrid.h"
#include "strategies/fsdp/options.h"
#include "strategies/offload_tier.h"
#include "strategies/process_group.h"
#include "strategies/registry.h"

#include <nlohmann/json.hpp>

#include <malloc.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace strata::recipes {
namespace fs = std::filesystem;

namespace {

/// Testing aid for the failure-handling tests (listed by --help-all, not by
/// --help): STRATA_TEST_FAIL_AT_STEP=S and STRATA_TEST_FAIL_RANK=R make rank R
/// throw at the start of step S.
class FailAtStep : public Callback {
 public:
  FailAtStep(int64_t step, int rank) : step_(step), rank_(rank) {}
  std::string name() const override { return "FailAtStep"; }
  void on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) override {
    TORCH_CHECK(!(step == step_ && trainer.strategy().rank() == rank_),
                "injected failure at step ", step, " on rank ", rank_, " (STRATA_TEST_FAIL_AT_STEP)");
  }

 private:
  int64_t step_;
  int rank_;
};

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

std::string self_executable(const char* argv0) {
  std::error_code ec;
  auto path = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : path.string();
}

nlohmann::json summary_json(const RunConfig& config, const FitResult& r, int world_size,
                            int64_t n_params, const std::string& data_name, double peak_flops,
                            double mfu) {
  nlohmann::json j;
  j["strategy"] = config.strategy;
  j["world_size"] = world_size;
  j["preset"] = config.preset;
  j["data"] = data_name;
  j["precision"] = config.precision;
  j["parameters"] = n_params;
  j["steps"] = r.steps;
  j["final_train_loss"] = r.final_train_loss;
  j["val_loss"] = r.val_loss ? nlohmann::json(*r.val_loss) : nlohmann::json(nullptr);
  j["val_accuracy"] = r.val_accuracy ? nlohmann::json(*r.val_accuracy) : nlohmann::json(nullptr);
  j["tokens_per_s"] = r.tokens_per_s;
  j["backward_s_per_step"] = r.backward_s_per_step;    // rank 0's
  j["grad_sync_s_per_step"] = r.grad_sync_s_per_step;  // rank 0's
  j["mfu"] = mfu;
  j["peak_flops_per_rank"] = peak_flops;
  j["elapsed_s"] = r.elapsed_s;
  j["stopped_early"] = r.stopped_early;
  j["stop_reason"] = r.stop_reason;
  j["peak_tensor_bytes"] = r.peak_tensor_bytes;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["model_state_bytes"] = nlohmann::json::array();
  for (size_t rank = 0; rank < r.model_state_bytes.size(); ++rank) {
    const auto& m = r.model_state_bytes[rank];
    // "other": what the peak held beyond model state (activations, buffers).
    const int64_t other = rank < r.peak_tensor_bytes.size() ? r.peak_tensor_bytes[rank] - m.total() : 0;
    j["model_state_bytes"].push_back(
        {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer}, {"other", other}});
  }
  nlohmann::json comm;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    comm[collective_name(static_cast<CollectiveKind>(k))] = r.comm_bytes.sent[k];
  }
  j["comm_bytes_rank0"] = comm;
  return j;
}

/// --offload-dir, or the output directory when it is not given.
std::string offload_dir_of(const RunConfig& config) {
  return config.offload_dir.empty() ? config.output_dir : config.offload_dir;
}

/// Exit-2 errors for a disk-offload directory that is missing, not writable,
/// or too small for the offloaded state of `local_ranks` ranks each holding
/// 1/shard_group of the model (fp32 shard, its gradient, AdamW's two moments;
/// at most one element of padding per rank and unit). When the directory is
/// the output directory, which may not exist yet, the space is checked where
/// it will be created (check_output_dir checks that it can be).
void check_offload_dir(const RunConfig& config, const GPTOptions& model, int shard_group, int local_ranks) {
  fs::path dir = offload_dir_of(config);
  if (config.offload_dir.empty()) {
    std::error_code ec;
    dir = fs::absolute(dir, ec);
    while (!dir.empty() && !fs::exists(dir, ec) && dir != dir.parent_path()) dir = dir.parent_path();
  } else {
    const auto problem = disk_tier_problem(dir.string());
    TORCH_CHECK_VALUE(problem.empty(), problem);
  }
  const int64_t units = model.n_layer() + 1;
  const int64_t per_rank = 4 * 4 * ((count_parameters(model) + shard_group - 1) / shard_group + units);
  const int64_t needed = per_rank * local_ranks;
  const int64_t free = free_bytes_at(dir.string());
  TORCH_CHECK_VALUE(free >= needed, "cannot use --offload-dir '", offload_dir_of(config), "': it has ",
                    format_bytes(free), " free, but the offloaded state of ", local_ranks, " rank(s) needs ",
                    format_bytes(needed));
}

void dump_params(const std::string& path, torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : module.named_parameters()) archive.write(item.key(), item.value());
  archive.save_to(path);
}

}  // namespace

GPTOptions resolve_model_options(const RunConfig& c, int64_t vocab_size, int64_t block_size) {
  GPTOptions o = gpt_preset(c.preset);
  if (c.n_layer > 0) o.n_layer(c.n_layer);
  if (c.n_head > 0) o.n_head(c.n_head);
  if (c.n_embd > 0) o.n_embd(c.n_embd);
  if (c.dropout >= 0) o.dropout(c.dropout);
  o.bias(c.bias);
  o.attention(c.attention);
  o.vocab_size(vocab_size).block_size(block_size);
  validate(o);
  return o;
}

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
      .optimizer(c.optimizer)
      .fused_adamw(c.fused_adamw)
      .lr(c.lr)
      .min_lr(std::min(c.min_lr, c.lr))
      .warmup_steps(c.warmup_steps)
      .weight_decay(c.weight_decay)
      .resume_from(c.resume);
}

int run_gpt(int argc, char** argv) {
  // Why: glibc raises its mmap threshold each time a large block is freed,
  // after which freed tensors stay in the heap and peak RSS keeps every
  // transient buffer a run ever had (an offloaded run's staging, a
  // re-gathered unit) instead of what is alive. A fixed threshold returns
  // large tensors to the system when they die, so RSS tracks tensor memory.
  // (A MALLOC_MMAP_THRESHOLD_ set by the user wins.)
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Installed first so it outlives every tensor of the run.
  MemoryTracker memory;
  StrategyRegistry registry;
  register_builtin_strategies(registry);

  std::vector<std::string> args(argv, argv + argc);
  ParseResult parsed = parse_run_config(args, gpt_preset_names(), registry.names());
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << std::endl;
    return parsed.exit_code;
  }
  const RunConfig config = *parsed.config;
  // A launcher's variables are input too: a bad value is a one-line error, exit 2.
  std::optional<DistEnv> env;
  try {
    env = dist_env_from(current_environment());
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  }

  // ---- Phase 1: everything that can be wrong with the input; exit code 2. ----
  std::unique_ptr<DataSource> data;
  std::optional<GPTOptions> model_options;
  try {
    // A rank re-reads its launcher's command line: strata's own launcher
    // passes --nproc (ranks per machine) and --nnodes on, and they must agree
    // with the world it set up. Under another launcher, leave them out.
    TORCH_CHECK_VALUE(!env || config.nproc == 1 || config.nproc == env->local_world_size, "--nproc ",
                      config.nproc, " disagrees with LOCAL_WORLD_SIZE ", env->local_world_size,
                      " set by the launcher; omit --nproc when joining an existing world");
    TORCH_CHECK_VALUE(!env || config.nnodes == 1 || config.nnodes * config.nproc == env->world_size,
                      "--nnodes ", config.nnodes, " x --nproc ", config.nproc,
                      " disagrees with WORLD_SIZE ", env->world_size,
                      " set by the launcher; omit --nnodes when joining an existing world");
    TORCH_CHECK_VALUE(config.strategy != "single" || (env ? env->world_size : config.nproc * config.nnodes) == 1,
                      "strategy 'single' runs one process but --nproc is ", config.nproc,
                      "; use ddp, oss, sdp or fsdp for several ranks");
    // Every local rank must find its device: check the highest LOCAL_RANK now.
    resolve_device(config.device, env ? env->local_rank : config.nproc - 1);
    data = make_data(config.data, config.block_size, config.vocab_size, config.seed);
    model_options = resolve_model_options(config, data->vocab_size(), data->block_size());
    trainer_options(config);
    // hybrid_shard's nodes must tile the world; known here from the launcher's
    // variables, or from --nproc (ranks per node) x --nnodes when self-launching.
    if (registry.contains(config.strategy) && registry.resolve(config.strategy) == "fsdp" &&
        config.sharding_strategy == "hybrid_shard") {
      check_hybrid_node_size(env ? env->local_world_size : config.nproc,
                             env ? env->world_size : config.nproc * config.nnodes);
    }
    if (registry.contains(config.strategy) && registry.resolve(config.strategy) == "fsdp" &&
        config.offload != "none") {
      const int local_ranks = env ? env->local_world_size : config.nproc;
      const int world = env ? env->world_size : config.nproc * config.nnodes;
      const bool hybrid = config.sharding_strategy == "hybrid_shard";
      const auto device = resolve_device(config.device, env ? env->local_rank : 0);
      const auto options = FSDPOptions()
                               .offload(parse_offload(config.offload))
                               .offload_dir(offload_dir_of(config))
                               .sharding_strategy(parse_sharding_strategy(config.sharding_strategy));
      check_offload_options(options, device, hybrid ? local_ranks : world);
      // Once per machine (its launcher, or its local rank 0, which the other
      // ranks cannot overtake: setup's collectives wait for it): the
      // directory must take the offload files of this machine's ranks.
      if (config.offload == "disk" && (!env || env->local_rank == 0)) {
        check_offload_dir(config, *model_options, hybrid ? local_ranks : world, local_ranks);
      }
    }
    // Last in phase 1, and only where rank 0's outputs will be written (the
    // launcher of node 0, or rank 0 itself): an output directory that cannot
    // be created is bad input, reported before any rank starts. Other nodes'
    // launchers write nothing there.
    if (env ? env->rank == 0 : config.node_rank == 0) check_output_dir(config.output_dir);
  } catch (const c10::Error& e) {
    // A rank that finds its input bad tells its launcher why (else the
    // launcher could only report "no error message").
    record_rank_error(e.what_without_backtrace());
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  }

  if (!env && (config.nproc > 1 || config.nnodes > 1)) {
    args[0] = self_executable(argv[0]);
    LaunchOptions launch;
    launch.nproc = config.nproc;
    launch.nnodes = config.nnodes;
    launch.node_rank = config.node_rank;
    launch.master_addr = config.master_addr;
    launch.master_port = config.master_port;
    launch.threads_per_rank = config.threads_per_rank;
    return launch_ranks(args, launch);
  }

  // ---- Phase 2: train; failures exit 1 and are recorded for the launcher. ----
  const int rank = env ? env->rank : 0;
  try {
    configure_threads(config.threads_per_rank, env ? env->local_world_size : 1);
    const torch::Device device = resolve_device(config.device, env ? env->local_rank : 0);
    if (device.is_cuda()) {
      // Before the process group: NCCL binds each rank to the current device.
      set_cuda_device(device.index());
      memory.measure_device(device);
    }
    Comm comm(device);
    if (env) {
      // A Comm that can split into subgroups (FSDP's hybrid_shard).
      comm = create_world_comm(ProcessGroupOptions(env->rank, env->world_size)
                                   .master_addr(env->master_addr)
                                   .master_port(env->master_port)
                                   .store_file(env->store_file)
                                   .agent_store(env->agent_store)
                                   .store_prefix(env->store_prefix)
                                   .gloo_interfaces(env->gloo_interfaces)
                                   .backend(backend_for(device))
                                   .timeout(std::chrono::milliseconds(
                                       static_cast<int64_t>(config.comm_timeout_s * 1000))),
                               device);
    }
    const bool is_zero = comm.rank() == 0;
    const fs::path out_dir(config.output_dir);
    if (is_zero) {
      const auto blas = check_blas_speed();
      if (blas.slow) std::cerr << blas.message << std::endl;
      fs::create_directories(out_dir);
      // A stale summary from an earlier run must not make this one look finished.
      fs::remove(out_dir / "summary.json");
      write_file_atomically((out_dir / "config.ini").string(), to_ini(config));
    }

    torch::manual_seed(config.seed);
    // Deferred for every strategy (one code path): the parameters get memory
    // in the strategy's setup, on its device, and the same values an eager
    // build has; FSDP builds one unit at a time, so a model that only fits
    // sharded starts at all. Sizes (num_params, FLOPs) count the logical model.
    GPTModule module(*model_options, /*deferred=*/true);
    if (config.activation_checkpointing > 0) {
      // Before the strategy's setup, so a strategy that wraps units (FSDP)
      // installs its layer outside: FSDP(checkpoint(block)).
      apply_activation_checkpointing(
          module, ActivationCheckpointOptions().every_n(config.activation_checkpointing));
    }
    StrategyConfig strategy_config;
    strategy_config.bucket_cap_mb = config.bucket_cap_mb;
    strategy_config.find_unused_parameters = config.find_unused_parameters;
    strategy_config.overlap_comm = config.overlap_comm;
    strategy_config.sharding_strategy = config.sharding_strategy;
    strategy_config.reshard_after_forward = config.reshard_after_forward;
    strategy_config.limit_all_gathers = config.limit_all_gathers;
    strategy_config.wrap_policy = config.wrap_policy;
    strategy_config.local_world_size = env ? env->local_world_size : 1;
    // fsdp: bf16-mixed gathers units in bf16 (fp32 master shards stay).
    strategy_config.param_dtype = parse_precision(config.precision) == Precision::kBf16Mixed ? "bf16" : "fp32";
    strategy_config.reduce_dtype = config.reduce_dtype;
    strategy_config.offload = config.offload;
    strategy_config.offload_dir = offload_dir_of(config);
    std::shared_ptr<Strategy> strategy = registry.create(config.strategy, comm, strategy_config);

    auto throughput = std::make_shared<Throughput>();
    std::vector<std::shared_ptr<Callback>> callbacks = {
        std::make_shared<RecordRankError>(),
        std::make_shared<DescribeStrategy>(),
        std::make_shared<ProgressBar>(ProgressBarOptions().mode(
            config.progress_bar ? ProgressMode::kAuto : ProgressMode::kPlain)),
        throughput,
        std::make_shared<MemoryMonitor>(),
        std::make_shared<LrMonitor>(),
    };
    if (config.checkpoint_every > 0) {
      callbacks.push_back(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions((out_dir / "checkpoints").string())
              .every_n_train_steps(config.checkpoint_every)
              .keep_last(config.checkpoint_keep)));
    }
    if (config.early_stopping_patience > 0) {
      callbacks.push_back(std::make_shared<EarlyStopping>(
          EarlyStoppingOptions().patience(config.early_stopping_patience)));
    }
    if (const char* fail = std::getenv("STRATA_TEST_FAIL_AT_STEP")) {
      const char* fail_rank = std::getenv("STRATA_TEST_FAIL_RANK");
      callbacks.push_back(std::make_shared<FailAtStep>(std::atoll(fail), fail_rank ? std::atoi(fail_rank) : 0));
    }
    // Last, so it sees what the other callbacks logged for the step.
    callbacks.push_back(std::make_shared<CsvLogger>(CsvLoggerOptions(out_dir.string())));

    if (is_zero) {
      std::cout << "strata-gpt | " << config.preset << " | " << module.model()->num_params() << " parameters | data "
                << data->name() << " | " << strategy->name() << " x " << comm.size() << " rank(s), "
                << at::get_num_threads() << " thread(s) each | device " << device << " | precision " << config.precision << "\n"
                << to_ini(config) << std::flush;
    }
    // Testing aid: one more copy of the parameters' bytes, allocated through
    // the tracked allocator before the run so every rank's peak includes it.
    torch::Tensor extra_param_copy;
    if (config.debug_extra_param_copy) {
      extra_param_copy = torch::zeros({module.model()->num_params()}, torch::TensorOptions().device(device));
    }
    Trainer trainer(trainer_options(config), strategy, callbacks, &memory);
    FitResult result = trainer.fit(module, *data);

    if (!config.dump_params.empty()) {
      // A collective on every rank: FSDP gathers its shards into the full
      // parameters for as long as `full` lives.
      const auto full = strategy->full_params();
      if (is_zero) dump_params(config.dump_params, module.module());
    }
    if (is_zero) {
      auto summary = summary_json(config, result, comm.size(), module.model()->num_params(),
                                  data->name(), throughput->peak_flops(), throughput->mfu());
      summary["device"] = device.str();  // rank 0's; rank r uses cuda:LOCAL_RANK on CUDA
      for (const auto& [key, value] : strategy->report()) {  // rank 0's
        const bool whole = value == std::floor(value) && std::abs(value) < 1e15;
        summary[key] = whole ? nlohmann::json(static_cast<int64_t>(value)) : nlohmann::json(value);
      }
      write_file_atomically((out_dir / "summary.json").string(), summary.dump(2) + "\n");
      int64_t peak = 0;
      for (auto b : result.peak_tensor_bytes) peak = std::max(peak, b);
      std::cout << "\n== done: " << result.steps << " steps in " << result.elapsed_s << " s"
                << " | train loss " << result.final_train_loss;
      if (result.val_loss) std::cout << " | val loss " << *result.val_loss;
      if (result.val_accuracy) std::cout << " | val accuracy " << 100.0 * *result.val_accuracy << "%";
      std::cout << " | " << static_cast<int64_t>(result.tokens_per_s) << " tokens/s"
                << " | MFU " << 100.0 * throughput->mfu() << "%"
                << " | peak tensor memory " << format_bytes(peak) << " (max over ranks)"
                << "\n   outputs in " << out_dir.string() << "/ (config.ini, metrics.csv, summary.json)"
                << std::endl;
    }
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
