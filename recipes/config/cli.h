#pragma once
// Command line and config file for the recipe binaries (Boost.Program_options).
// Every option has the same key on the command line (--max-steps 10) and in an
// INI config file (max-steps = 10); the command line wins over the file.
#include "strata/recipes/config/model_keys.h"
#include "strata/strategies/registry.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace strata::recipes {

/// Everything a recipe run needs, resolved from defaults, --config and argv.
struct RunConfig {
  // model
  /// parse_run_config starts it at the registered families' default
  /// (ModelKeys::default_preset).
  std::string preset;
  int64_t block_size = 0;    ///< 0: the data's natural length
  /// The model family's options given on the command line or in --config
  /// (n-layer, attention, lora-rank, ...): key -> value as canonical text.
  /// Each is declared by the registered families that read it
  /// (recipes/models/spec.h, ModelSpec::options); the family that resolves
  /// the model checks its rules and takes its own defaults for the rest.
  std::map<std::string, std::string> model_options;
  // data
  std::string data = "addition";
  int64_t vocab_size = 50257;  ///< only for nanoGPT .bin data
  /// A tokenizer.json (or a directory holding one) for text and JSONL data;
  /// "": --init-from's when it has one; "none": bytes (recipes/app/run_data.h).
  std::string tokenizer;
  std::string val_data;  ///< held-out text or JSONL ("": the last 10% of --data's tokens)
  std::string prompt_style = "auto";  ///< instruction data: alpaca, llama3, chatml, ... (auto: the tokenizer's)
  bool mask_prompt = true;            ///< instruction data: the prompt's tokens out of the loss
  /// Score the model on the held-out set (--val-data, else all of text or
  /// instruction --data) and stop: no step (Trainer::evaluate).
  bool eval_only = false;
  // strategy and launch
  std::string strategy = "single";
  std::string device = "auto";  ///< auto, cpu, cuda (cuda:LOCAL_RANK)
  int nproc = 1;
  /// Tensor-parallel ranks per group (strategies/tp): the strategy runs over
  /// world / tp_size data-parallel groups (1: off).
  int tp_size = 1;
  bool sequence_parallel = false;  ///< --tp-size > 1: activations split along the sequence between the parallel layers
  /// Pipeline stages' ranks (strategies/pp, docs/pipeline.md): the model's
  /// blocks split into pp_size stages (x pp_virtual_stages), the
  /// micro-batches (--accumulate-grad-batches) run by pp_schedule (1: off).
  int pp_size = 1;
  std::string pp_schedule = "1f1b";
  int pp_virtual_stages = 1;
  std::string pp_split;  ///< blocks per stage, "3,3,2" ("": balanced by parameters)
  int nnodes = 1;            ///< machines, one strata-gpt launcher each (torchrun's --nnodes)
  int node_rank = 0;         ///< this machine's index in [0, nnodes)
  int threads_per_rank = 0;  ///< 0: cores / ranks
  std::string master_addr = "127.0.0.1";
  int master_port = 0;       ///< rank 0's TCP store, --nnodes > 1 only
  double comm_timeout_s = 60.0;
  int64_t flight_recorder = 2048;  ///< collectives kept per rank for the flight dump (0: off)
  /// Strategy options given on the command line or in --config: key ->
  /// value as text (canonical: "true", "25", "full_shard"). Each is declared
  /// by the registered strategies that read it (strategies/spec.h); the
  /// chosen strategy's others take their defaults (StrategySpec::parse_args).
  std::map<std::string, std::string> strategy_options;
  std::string offload = "none";  ///< none, cpu (pinned host; CUDA only), disk: what moves is the strategy's choice
  std::string offload_dir;       ///< --offload disk: the file's directory ("": --output-dir)
  int64_t activation_checkpointing = 0;  ///< 0: off; n: every n-th block (1: every block)
  /// What a checkpointed block keeps: full, attention, op (ActivationCheckpointOptions::policy)
  std::string ac_policy = "full";
  /// --strategy auto: per-rank memory budget ("4GiB", "512MiB", bytes; "":
  /// MemAvailable / local ranks, or the GPU's memory on CUDA).
  std::string memory_budget;
  bool no_memory_check = false;  ///< skip the pre-flight memory check
  bool dry_run = false;          ///< --dry-run: the sharding plan for --nproc ranks, in one process, no training
  bool cpu_cache = true;         ///< reuse freed CPU blocks >= 1 MiB (trainer/block_cache.h)
  // optimisation
  int64_t max_steps = 2500;
  int64_t batch_size = 64;
  int64_t accumulate_grad_batches = 1;
  std::string optimizer = "adamw";  ///< adamw or sgd
  double adam_beta1 = 0.9;          ///< adamw: the first moment's decay
  double adam_beta2 = 0.95;         ///< adamw: the second moment's decay
  double adam_eps = 1e-8;           ///< adamw: added to the second moment's root
  double momentum = 0.0;            ///< sgd: momentum (0: plain SGD)
  bool nesterov = false;            ///< sgd: Nesterov momentum (needs momentum > 0)
  bool fused_adamw = true;          ///< adamw: FusedAdamW (one fused pass) instead of torch::optim::AdamW
  std::string adamw_kernel = "strata";  ///< fused-adamw: strata (kernels/fused_adamw.h) or aten (at::_fused_adamw_)
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 100;
  double weight_decay = 0.1;
  double gradient_clip_val = 1.0;
  std::string precision = "32";
  // fp16 loss scaling (--precision 16-mixed only; DeepSpeed's fp16 names and
  // defaults, trainer/loss_scaler.h)
  double loss_scale = 0.0;               ///< 0: dynamic; > 0: this static scale
  int64_t initial_scale_power = 16;      ///< dynamic: the first scale is 2^this
  int64_t loss_scale_window = 1000;      ///< dynamic: clean steps before the scale doubles
  int64_t hysteresis = 2;                ///< dynamic: overflows before the scale halves
  bool consecutive_hysteresis = false;   ///< dynamic: a clean step restores the hysteresis
  double min_loss_scale = 1.0;           ///< dynamic: the floor; an overflow there is an error
  uint64_t seed = 1337;
  // loop and outputs
  int64_t log_every_n_steps = 100;
  int64_t val_check_interval = 500;
  int64_t limit_val_batches = 32;
  std::string output_dir = "runs/latest";
  int64_t checkpoint_every = 0;   ///< 0: no periodic checkpoints
  int64_t checkpoint_keep = 2;     ///< newest checkpoints kept (0: all)
  std::string checkpoint_format = "auto";  ///< full | sharded | auto (sharded for oss/sdp/fsdp)
  std::string checkpoint_monitor;  ///< "": none; val_loss, val_accuracy or loss: keep the best
  std::string checkpoint_mode = "min";  ///< min or max: which way checkpoint_monitor improves
  int64_t checkpoint_keep_best = 1;     ///< best checkpoints kept by checkpoint_monitor
  bool checkpoint_async = false;        ///< write checkpoints on a thread while training goes on
  int64_t early_stopping_patience = 0;  ///< 0: off
  std::string resume;             ///< checkpoint dir to resume from, "last" or "auto"
  std::string profile;           ///< --profile DIR: Chrome traces of a few steps ("": off)
  double peak_flops = 0.0;        ///< per-rank peak FLOP/s for MFU (0: measured once, recipes/app/peak_flops.h)
  bool progress_bar = true;       ///< live bar on a TTY (plain lines otherwise)
  // Python interop (recipes/models/gpt/interop.h, recipes/models/torchscript/torchscript.h)
  std::string init_from;          ///< the starting weights: a model directory or a nanoGPT-named file
  std::string init_adapter;       ///< a PEFT LoRA adapter directory the adapters start from
  std::string export_weights;     ///< rank 0 writes the trained GPT's weights here (nanoGPT names)
  std::string torchscript;        ///< train this TorchScript model instead of the GPT
  std::string export_torchscript; ///< rank 0 saves the trained TorchScript model here
  // testing aids (listed by --help-all only)
  std::string dump_params;        ///< rank 0 writes final params here (torch::save)
  /// Every rank keeps an extra fp32 buffer of the model's parameter count
  /// alive for the whole run (the bench gate test's injected memory regression).
  bool debug_extra_param_copy = false;
  /// At this step (1-based; 0: never) the last rank's loss gradient is
  /// multiplied by 1e6 on its way back: 16-mixed overflows there.
  int64_t debug_overflow_step = 0;
  // From a DeepSpeed / Accelerate --config (recipes/config/foreign_config.h), not
  // options of their own (config.ini holds what they resolved to).
  bool offload_host_from_config = false;  ///< its offload to "cpu": nothing to offload on a CPU device
  int64_t config_global_batch = 0;        ///< its train_batch_size (0: none): checked against the world
  bool batch_size_given = false;          ///< --batch-size came from the config or the command line
  bool accumulate_given = false;          ///< so did --accumulate-grad-batches (else train_batch_size derives it)
  /// Every key given on the command line or in --config (not defaulted): a
  /// model family is asked only for the options given to it (models/spec.h).
  std::set<std::string> given_keys;
  /// Set by the run (ModelConfig::source_directory, source_keys): the
  /// --init-from directory whose config gave the model, and the model keys
  /// it gave; config.ini then comments out the preset and those keys, which
  /// a --config of it must not give.
  std::string model_source;
  std::set<std::string> model_source_keys;
  /// Set by the run: the model family and the model keys it does not read
  /// (a Llama reads no --activation); config.ini comments those out.
  std::string model_family;
  std::set<std::string> model_unread;
  std::vector<std::string> config_notes;  ///< what it set without effect, printed once at start
};

/// Outcome of parsing: either a config to run, or text to print and an exit code.
struct ParseResult {
  std::optional<RunConfig> config;
  int exit_code = 0;        ///< 0 for --help, 2 for bad input
  std::string message;      ///< --help text, or the one-line error
};

/// Parses argv (argv[0] is the program name). Never throws or exits: unknown
/// options, bad values, unreadable or unknown keys in --config each give
/// exit_code 2 and a one-line message naming the value and what is allowed.
/// Validates what does not need the data: positive steps/batch/lr, a known
/// preset, strategy (one of `strategies`, or auto), optimizer and precision,
/// nproc >= 1 (the model's own rules are its family's, at resolution), the chosen
/// strategy's own options (its spec's rules), and that no strategy option
/// (given on the command line or in --config) is given to a strategy that
/// would ignore it. --help lists the main options and every registered
/// strategy's; --help-all adds the testing aids.
ParseResult parse_run_config(const std::vector<std::string>& argv, const ModelKeys& models,
                             const StrategyRegistry& strategies);

/// The resolved config as INI text (same keys), for printing and config.ini.
/// Strategy options config.strategy does not read are written as comments,
/// so the text is valid as --config for the same strategy.
std::string to_ini(const RunConfig& config, const ModelKeys& models, const StrategyRegistry& strategies);

/// The options of `config.strategy` (resolved through `strategies`) from
/// config.strategy_options and the defaults; throws c10::ValueError (one
/// line) for a bad value or an option it does not declare.
StrategyArgs strategy_args(const RunConfig& config, const StrategyRegistry& strategies);

}  // namespace strata::recipes
