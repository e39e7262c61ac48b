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
#include "recipes/interop.h"
#include "recipes/torchscript.h"
#include "recipes/output_dir.h"
#include "recipes/planner.h"
#include "strategies/activation_checkpoint.h"
#include "strategies/fsdp/hybrid.h"
#include "strategies/fsdp/options.h"
#include "strategies/offload_tier.h"
#include "strategies/process_group.h"
#include "strategies/registry.h"

#include <nlohmann/json.hpp>

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
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

/// The planner's name for the configured strategy; "" when it has no
/// formula for it (an unknown strategy, fsdp's other sharding strategies).
std::string planner_strategy(const StrategyRegistry& registry, const RunConfig& c) {
  if (!registry.contains(c.strategy)) return "";
  const std::string name = registry.resolve(c.strategy);
  if (name == "fsdp" && c.sharding_strategy != "full_shard") return "";
  for (const char* known : {"single", "ddp", "oss", "sdp", "fsdp"}) {
    if (name == known) return name;
  }
  return "";
}

PlanRequest plan_request(const RunConfig& c, const GPTOptions& model, const std::string& strategy, int world) {
  return PlanRequest(model, strategy, world)
      .micro_batch(c.batch_size)
      .precision(parse_precision(c.precision))
      .activation_checkpointing(c.activation_checkpointing)
      .offload(c.offload)
      .optimizer(c.optimizer);
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

/// What the run resolved, for the printed config and config.ini: the model's
/// sizes, the thread count and the data's vocabulary instead of the flags'
/// "0: automatic" defaults.
RunConfig resolved_config(RunConfig c, const GPTOptions& model, int threads) {
  c.n_layer = model.n_layer();
  c.n_head = model.n_head();
  c.n_embd = model.n_embd();
  c.block_size = model.block_size();
  c.dropout = model.dropout();
  c.vocab_size = model.vocab_size();
  c.threads_per_rank = threads;
  return c;
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
  // Per rank (see RankStepStats; "memory" splits peak_tensor_bytes: model
  // state as the strategy reports it at the end of the first step, and
  // activations_other = peak - that state, i.e. activations, gathered FSDP
  // units, buckets and transients at the peak).
  j["per_rank"] = nlohmann::json::array();
  for (size_t rank = 0; rank < r.per_rank.size(); ++rank) {
    const auto& s = r.per_rank[rank];
    nlohmann::json e;
    e["rank"] = rank;
    e["forward_s"] = s.forward_s;
    e["backward_s"] = s.backward_s;
    e["comm_wait_s"] = s.comm_wait_s;
    e["optimizer_s"] = s.optimizer_s;
    e["step_s"] = s.step_s;
    e["tokens_per_s"] = s.tokens_per_s;
    if (rank < r.peak_tensor_bytes.size() && rank < r.model_state_bytes.size()) {
      const auto& m = r.model_state_bytes[rank];
      e["peak_tensor_bytes"] = r.peak_tensor_bytes[rank];
      e["memory"] = {{"params", m.params},
                     {"grads", m.grads},
                     {"optimizer", m.optimizer},
                     {"activations_other", r.peak_tensor_bytes[rank] - m.total()}};
    }
    if (rank < r.peak_rss_bytes.size()) e["peak_rss_bytes"] = r.peak_rss_bytes[rank];
    nlohmann::json bytes;
    for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
      bytes[collective_name(static_cast<CollectiveKind>(k))] = s.comm_bytes_per_step[k];
    }
    e["comm_bytes_per_step"] = bytes;
    j["per_rank"].push_back(e);
  }
  j["matmul_peak_flops"] = peak_flops;
  j["psi"] = n_params;
  // Bytes rank 0 sent per step over Ψ·(N-1)/N, Ψ = fp32 parameter bytes: the
  // ZeRO paper's multiple (ddp/oss/sdp 2, fsdp 3) independent of N.
  if (world_size > 1 && !r.per_rank.empty() && n_params > 0) {
    double sent = 0.0;
    for (double b : r.per_rank[0].comm_bytes_per_step) sent += b;
    j["comm_ratio_to_psi"] = sent / (4.0 * double(n_params) * double(world_size - 1) / double(world_size));
  } else {
    j["comm_ratio_to_psi"] = nullptr;
  }
  return j;
}

/// Adds the planner's prediction beside the measured numbers: per rank
/// "predicted" (the ZeRO formula's params/grads/optimizer, with measured ÷
/// predicted ratios) and "predicted_peak_bytes" (the planner's whole peak).
void add_predictions(nlohmann::json& summary, const ModelStatePrediction& state, int64_t predicted_peak) {
  summary["predicted_peak_bytes"] = predicted_peak;
  for (auto& e : summary["per_rank"]) {
    e["predicted"] = {{"params", state.params}, {"grads", state.grads}, {"optimizer", state.optimizer},
                      {"peak", predicted_peak}};
    if (!e.contains("memory")) continue;
    auto ratio = [](int64_t measured, int64_t predicted) {
      return predicted > 0 ? nlohmann::json(double(measured) / double(predicted)) : nlohmann::json(nullptr);
    };
    const auto& m = e["memory"];
    e["measured_over_predicted"] = {
        {"params", ratio(m["params"].get<int64_t>(), state.params)},
        {"grads", ratio(m["grads"].get<int64_t>(), state.grads)},
        {"optimizer", ratio(m["optimizer"].get<int64_t>(), state.optimizer)},
        {"peak", ratio(e["peak_tensor_bytes"].get<int64_t>(), predicted_peak)}};
  }
}

/// --offload-dir, or the output directory when it is not given.
std::string offload_dir_of(const RunConfig& config) {
  return config.offload_dir.empty() ? config.output_dir : config.offload_dir;
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

/// Bytes one rank offloads: fsdp its fp32 shard, the shard's gradient and
/// AdamW's two moments (1/shard_group of the model, plus at most one element
/// of padding per rank and unit); the others AdamW's two moments of what
/// their optimizer steps (the whole model; oss/sdp 1/world of it). SGD
/// (no momentum) has no state.
int64_t offloaded_bytes_per_rank(const RunConfig& config, const std::string& strategy, const GPTOptions& model,
                                 int shard_group) {
  const int64_t psi = count_parameters(model);
  if (strategy == "fsdp") {
    const int64_t units = model.n_layer() + 1;
    return 4 * 4 * ((psi + shard_group - 1) / shard_group + units);
  }
  if (config.optimizer == "sgd") return 0;
  return 2 * 4 * ((psi + shard_group - 1) / shard_group);
}

void dump_params(const std::string& path, torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : module.named_parameters()) archive.write(item.key(), item.value());
  archive.save_to(path);
}

/// The GPT started from a weights file (--init-from): a strategy's setup
/// materialises the deferred parameters and calls init_parameter() for each
/// (FSDP: unit by unit, into its flat buffers), which copies the file's
/// value instead of drawing one (and drops it: after setup no copy of the
/// file stays in memory). The weights were checked against the model
/// (from_nanogpt) before.
class GPTFromWeights : public GPTModule {
 public:
  GPTFromWeights(const GPTOptions& options, NamedTensors weights)
      : GPTModule(options, /*deferred=*/true), weights_(std::move(weights)) {}
  void init_parameter(const std::string& name, const torch::Tensor& param) override {
    const auto it = weights_.find(name);
    TORCH_CHECK(it != weights_.end(), "--init-from: no value for parameter ", name);
    torch::NoGradGuard no_grad;
    param.copy_(it->second);
    weights_.erase(it);  // called once per parameter: the file's copy is not needed again
  }

 private:
  NamedTensors weights_;
};

/// Exit-2 error unless `path`'s directory exists (an output file written at
/// the end of training must not fail after the training).
void check_output_file(const std::string& flag, const std::string& path) {
  const fs::path parent = fs::absolute(fs::path(path)).parent_path();
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(parent, ec), "cannot write --", flag, " '", path, "': directory '",
                    parent.string(), "' does not exist");
  TORCH_CHECK_VALUE(!fs::is_directory(fs::path(path), ec), "cannot write --", flag, " '", path,
                    "': it is a directory");
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

}  // namespace

std::string checkpoints_dir(const RunConfig& config) {
  return (fs::path(config.output_dir) / "checkpoints").string();
}

std::string resolve_resume(const RunConfig& config) {
  std::string dir = config.resume;
  if (dir.empty()) return dir;
  if (dir == "last") {
    dir = latest_checkpoint(checkpoints_dir(config));
    TORCH_CHECK_VALUE(!dir.empty(), "--resume last: no checkpoint (step-<N> directory) in '",
                      checkpoints_dir(config), "'");
  }
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(dir, ec), "--resume '", config.resume, "': '", dir, "' is not a directory");
  // A ModelCheckpoint directory names its step: a resume with nothing left to
  // train is bad input (the Trainer checks the step inside any checkpoint too).
  const int64_t step = checkpoint_step(dir);
  TORCH_CHECK_VALUE(step < config.max_steps, "--resume '", config.resume, "': checkpoint '", dir,
                    "' is at step ", step, ", not below --max-steps ", config.max_steps,
                    "; nothing left to train (raise --max-steps)");
  return dir;
}

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
      .resume_from(c.resume)
      .checkpoint_format(c.checkpoint_format == "auto" ? "" : c.checkpoint_format);
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
  auto strategy_names = registry.names();
  strategy_names.push_back("auto");  // resolved in phase 1 by the memory planner
  ParseResult parsed = parse_run_config(args, gpt_preset_names(), strategy_names);
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << std::endl;
    return parsed.exit_code;
  }
  RunConfig resolved = *parsed.config;
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
  std::optional<NamedTensors> init_weights;  // --init-from, checked against the model
  try {
    resolved.resume = resolve_resume(resolved);
  } catch (const c10::Error& e) {
    record_rank_error(e.what_without_backtrace());
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  }
  RunConfig config = resolved;  // phase 1 still resolves --strategy auto
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
    if (!config.init_from.empty()) {
      GPTModule shape_only(*model_options, /*deferred=*/true);  // names and shapes, no memory
      init_weights = from_nanogpt(read_weights(config.init_from), shape_only.module(), *model_options,
                                  config.init_from);
    }
    if (!config.torchscript.empty()) {
      TorchScriptModule probe(config.torchscript);
      check_torchscript_model(probe, *data, config.torchscript);
    }
    if (!config.export_weights.empty()) check_output_file("export-weights", config.export_weights);
    if (!config.export_torchscript.empty()) check_output_file("export-torchscript", config.export_torchscript);
    const int local_ranks = env ? env->local_world_size : config.nproc;
    const int world = env ? env->world_size : config.nproc * config.nnodes;
    std::optional<ActivationProfile> profile;
    // The planner models strata's GPT: a --torchscript model is not planned.
    TORCH_CHECK_VALUE(config.strategy != "auto" || config.torchscript.empty(),
                      "--strategy auto plans strata's GPT presets; with --torchscript name the strategy");
    if (config.strategy == "auto") {
      // Ranks of strata's own launcher never see "auto" (it passes them the
      // choice); ranks of another launcher each decide, and must agree: a
      // budget from MemAvailable would differ between them.
      TORCH_CHECK_VALUE(!env || !config.memory_budget.empty(),
                        "--strategy auto under an external launcher needs --memory-budget (every rank must "
                        "make the same choice; available memory differs between them)");
      const auto device = resolve_device(config.device, env ? env->local_rank : 0);
      const int64_t budget = !config.memory_budget.empty() ? parse_byte_size(config.memory_budget)
                             : device.is_cuda()            ? cuda_total_memory_bytes(device.index())
                                                           : available_memory_bytes() / std::max(1, local_ranks);
      profile = activation_profile(*model_options, config.batch_size, parse_precision(config.precision));
      const auto rows = plan_candidates(
          plan_request(config, *model_options, world == 1 ? "single" : "ddp", world), *profile, budget);
      const std::string table = format_plan_table(rows, budget);
      const auto pick = pick_fastest_fitting(rows);
      TORCH_CHECK_VALUE(pick.has_value(), "--strategy auto: no strategy is predicted to fit ",
                        format_bytes(budget), " per rank (", world, " rank(s), batch ", config.batch_size,
                        "):\n", table);
      const auto& chosen = rows[*pick];
      if (!env || env->rank == 0) {
        std::cout << "strata-gpt --strategy auto: per-rank peak predicted for " << config.preset << ", "
                  << world << " rank(s), batch " << config.batch_size << " x block "
                  << model_options->block_size() << ", precision " << config.precision << " ("
                  << (profile->measured ? "activations probed" : "activations by formula") << ")\n"
                  << table << "chosen: " << chosen.label << " (the fastest predicted to fit; order: ";
        for (size_t i = 0; i < rows.size(); ++i) std::cout << (i > 0 ? ", " : "") << rows[i].label;
        std::cout << ")" << std::endl;
      }
      config.strategy = chosen.request.strategy();
      config.activation_checkpointing = chosen.request.activation_checkpointing();
      config.offload = chosen.request.offload();
      config.memory_budget.clear();
      std::vector<std::pair<std::string, std::string>> set = {
          {"strategy", config.strategy},
          {"activation-checkpointing", std::to_string(config.activation_checkpointing)},
          {"offload", config.offload}};  // every strategy takes --offload (sdp+offload-disk)
      args = rewrite_args(args, {"strategy", "activation-checkpointing", "offload", "memory-budget"}, set);
    }
    // The pre-flight memory check: once per machine, before any rank starts
    // (the launcher, a single process, or local rank 0 of another launcher;
    // strata's own ranks were checked by their launcher).
    const bool strata_rank = env && std::getenv("STRATA_ERROR_FILE") != nullptr;
    const std::string planned = planner_strategy(registry, config);
    if (!config.no_memory_check && !planned.empty() && config.torchscript.empty() && !strata_rank && (!env || env->local_rank == 0) &&
        resolve_device(config.device, 0).is_cpu()) {
      const auto start = std::chrono::steady_clock::now();
      const auto request = plan_request(config, *model_options, planned, world);
      const int64_t available = available_memory_bytes();
      // Fast path: when model state alone (no activations) cannot fit, refuse
      // without probing (building even two blocks of a large model takes
      // seconds); the list of what would fit then uses the formula.
      const int64_t state_only = predict_peak(request, ActivationProfile{}).peak();
      const bool hopeless = available > 0 && state_only * local_ranks > available;
      if (!profile) {
        profile = hopeless ? estimate_activations(*model_options, config.batch_size, parse_precision(config.precision))
                           : activation_profile(*model_options, config.batch_size, parse_precision(config.precision));
      }
      const int64_t peak = predict_peak(request, *profile).peak();
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (available > 0 && peak * local_ranks > available) {
        std::string fitting;
        for (const auto& row : plan_candidates(request, *profile, available / local_ranks)) {
          if (row.fits) fitting += (fitting.empty() ? "" : ", ") + row.label + " (" + format_bytes(row.prediction.peak()) + ")";
        }
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%.2f", took);
        TORCH_CHECK_VALUE(false, "pre-flight memory check: ", config.strategy, " x ", local_ranks,
                          " local rank(s) of ", config.preset, " at batch ", config.batch_size,
                          " is predicted to peak at ", format_bytes(peak), " per rank, ",
                          format_bytes(peak * local_ranks), " in all, but this machine has ",
                          format_bytes(available), " available; predicted to fit: ",
                          fitting.empty() ? std::string("nothing at this batch size") : fitting,
                          " (checked in ", seconds, " s; --no-memory-check skips this check)");
      }
    }
    // hybrid_shard's nodes must tile the world; known here from the launcher's
    // variables, or from --nproc (ranks per node) x --nnodes when self-launching.
    if (registry.contains(config.strategy) && registry.resolve(config.strategy) == "fsdp" &&
        config.sharding_strategy == "hybrid_shard") {
      check_hybrid_node_size(env ? env->local_world_size : config.nproc,
                             env ? env->world_size : config.nproc * config.nnodes);
    }
    if (registry.contains(config.strategy) && config.offload != "none") {
      const std::string strategy = registry.resolve(config.strategy);
      const int local_ranks = env ? env->local_world_size : config.nproc;
      const int world = env ? env->world_size : config.nproc * config.nnodes;
      const auto device = resolve_device(config.device, env ? env->local_rank : 0);
      // The ranks that share one copy of the offloaded state.
      int shard_group = 1;
      if (strategy == "fsdp") {
        const bool hybrid = config.sharding_strategy == "hybrid_shard";
        shard_group = hybrid ? local_ranks : world;
        const auto options = FSDPOptions()
                                 .offload(parse_offload(config.offload))
                                 .offload_dir(offload_dir_of(config))
                                 .sharding_strategy(parse_sharding_strategy(config.sharding_strategy));
        check_offload_options(options, device, shard_group);
      } else {
        if (strategy == "oss" || strategy == "sdp") shard_group = world;
        check_offload_kind(parse_offload(config.offload), offload_dir_of(config), device);
      }
      // Once per machine (its launcher, or its local rank 0, which the other
      // ranks cannot overtake: setup's collectives wait for it): the
      // directory must take the offload files of this machine's ranks.
      // (Sized for the GPT: a --torchscript model's size is not checked.)
      if (config.offload == "disk" && config.torchscript.empty() && (!env || env->local_rank == 0)) {
        check_offload_dir(config, offloaded_bytes_per_rank(config, strategy, *model_options, shard_group),
                          local_ranks);
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
      write_file_atomically((out_dir / "config.ini").string(),
                            to_ini(resolved_config(config, *model_options, at::get_num_threads())));
    }

    torch::manual_seed(config.seed);
    // Deferred for every strategy (one code path): the parameters get memory
    // in the strategy's setup, on its device, and the same values an eager
    // build has; FSDP builds one unit at a time, so a model that only fits
    // sharded starts at all. Sizes (num_params, FLOPs) count the logical model.
    // --torchscript: the user's scripted model instead (its own weights).
    std::unique_ptr<TrainingModule> module;
    TorchScriptModule* scripted = nullptr;
    int64_t n_params = 0;
    if (!config.torchscript.empty()) {
      auto loaded = std::make_unique<TorchScriptModule>(config.torchscript);
      scripted = loaded.get();
      n_params = loaded->num_params();
      module = std::move(loaded);
    } else {
      std::unique_ptr<GPTModule> gpt;
      if (init_weights) {
        gpt = std::make_unique<GPTFromWeights>(*model_options, std::move(*init_weights));
      } else {
        gpt = std::make_unique<GPTModule>(*model_options, /*deferred=*/true);
      }
      n_params = gpt->model()->num_params();
      module = std::move(gpt);
    }
    if (config.activation_checkpointing > 0) {
      // Before the strategy's setup, so a strategy that wraps units (FSDP)
      // installs its layer outside: FSDP(checkpoint(block)).
      apply_activation_checkpointing(
          *module, ActivationCheckpointOptions().every_n(config.activation_checkpointing));
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
    if (config.checkpoint_every > 0 || !config.checkpoint_monitor.empty()) {
      callbacks.push_back(std::make_shared<ModelCheckpoint>(
          ModelCheckpointOptions(checkpoints_dir(config))
              .every_n_train_steps(config.checkpoint_every)
              .keep_last(config.checkpoint_keep)
              .monitor(config.checkpoint_monitor)
              .mode(config.checkpoint_mode == "max" ? MonitorMode::kMax : MonitorMode::kMin)
              .save_top_k(config.checkpoint_keep_best)));
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
      std::cout << "strata-gpt | " << (scripted ? "torchscript " + config.torchscript : config.preset) << " | "
                << n_params << " parameters | data "
                << data->name() << " | " << strategy->name() << " x " << comm.size() << " rank(s), "
                << at::get_num_threads() << " thread(s) each | device " << device << " | precision " << config.precision << "\n"
                << to_ini(resolved_config(config, *model_options, at::get_num_threads())) << std::flush;
    }
    // Testing aid: one more copy of the parameters' bytes, allocated through
    // the tracked allocator before the run so every rank's peak includes it.
    torch::Tensor extra_param_copy;
    if (config.debug_extra_param_copy) {
      extra_param_copy = torch::zeros({n_params}, torch::TensorOptions().device(device));
    }
    Trainer trainer(trainer_options(config), strategy, callbacks, &memory);
    FitResult result = trainer.fit(*module, *data);

    if (!config.dump_params.empty()) {
      // A collective on every rank: FSDP gathers its shards into the full
      // parameters for as long as `full` lives.
      const auto full = strategy->full_params();
      if (is_zero) dump_params(config.dump_params, module->module());
    }
    if (!config.export_weights.empty() || !config.export_torchscript.empty()) {
      // A collective on every rank: FSDP gathers its shards into the full
      // parameters for as long as `full` lives; rank 0 writes (atomically).
      const auto full = strategy->full_params();
      if (is_zero && !config.export_weights.empty()) {
        write_weights(config.export_weights, named_parameters_of(module->module()), *model_options);
      }
      if (is_zero && scripted) scripted->save(config.export_torchscript);
    }
    if (is_zero) {
      auto summary = summary_json(config, result, comm.size(), n_params,
                                  data->name(), throughput->peak_flops(), throughput->mfu());
      summary["device"] = device.str();  // rank 0's; rank r uses cuda:LOCAL_RANK on CUDA
      if (const auto planned = planner_strategy(registry, config); !planned.empty()) {
        // After fit (the probe's allocations go to its own tracker, so the
        // run's numbers above are unaffected).
        const auto request = plan_request(config, *model_options, planned, comm.size());
        const auto profile = activation_profile(*model_options, config.batch_size, parse_precision(config.precision));
        add_predictions(summary, predict_model_state(request), predict_peak(request, profile).peak());
      }
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
