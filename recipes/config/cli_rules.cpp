#include "strata/recipes/config/cli_rules.h"

#include "strata/strategies/activation_checkpoint.h"

#include <algorithm>
#include <iterator>
#include <cmath>
#include <filesystem>
#include <tuple>

namespace strata::recipes {
namespace {

/// How a key was given, for messages: "--key" on the command line, "config
/// file 'x': key" in --config.
std::string named(const std::string& where, const std::string& key) {
  return where + (where.empty() ? "--" : "") + key;
}

std::string choice(const std::string& what, const std::string& value, const std::vector<std::string>& allowed) {
  if (allowed.empty()) return "";  // the caller gave no list: nothing to check against
  for (const auto& name : allowed) {
    if (value == name) return "";
  }
  return "unknown " + what + " '" + value + "'; available: " + join(allowed);
}

/// Every value that must be one of a list.
std::string check_choices(const RunConfig& c, const std::vector<std::string>& presets,
                          const StrategyRegistry& strategies) {
  auto strategy_names = strategies.names();
  strategy_names.push_back("auto");  // resolved in phase 1 by the memory planner
  const std::vector<std::tuple<const char*, const std::string*, std::vector<std::string>>> rules = {
      {"preset", &c.preset, presets},
      {"strategy", &c.strategy, strategy_names},
      {"precision", &c.precision, precision_names()},
      {"device", &c.device, {"auto", "cpu", "cuda"}},
      {"optimizer", &c.optimizer, optimizer_names()},
      {"adamw-kernel", &c.adamw_kernel, {"strata", "aten"}},    // fused_adamw_kernel_names(), tested
      {"offload", &c.offload, {"none", "cpu", "disk"}},
      {"ac-policy", &c.ac_policy, checkpoint_policy_names()},
      {"checkpoint-format", &c.checkpoint_format, {"auto", "full", "sharded"}},
      {"checkpoint-mode", &c.checkpoint_mode, {"min", "max"}},
  };
  for (const auto& [what, value, allowed] : rules) {
    if (auto error = choice(what, *value, allowed); !error.empty()) return error;
  }
  if (!c.checkpoint_monitor.empty()) return choice("checkpoint-monitor", c.checkpoint_monitor, {"val_loss", "val_accuracy", "loss"});
  return "";
}

/// Options given where nothing reads them (they would be silently ignored).
std::string check_ignored(const RunConfig& c, const ModelKeys& models, const GivenKeys& given,
                          const StrategyRegistry& strategies) {
  if (!c.memory_budget.empty() && c.strategy != "auto") {
    return "--memory-budget applies only with --strategy auto (got --strategy " + c.strategy + ")";
  }
  if (c.ac_policy != "full" && c.activation_checkpointing == 0 && c.strategy != "auto") {
    return "--ac-policy " + c.ac_policy + " applies only to checkpointed blocks: add --activation-checkpointing N";
  }
  if (!c.offload_dir.empty() && c.offload != "disk") {
    return "--offload-dir applies only with --offload disk (got --offload " + c.offload + ")";
  }
  if (const auto it = given.find("checkpoint-async"); it != given.end() && c.checkpoint_async) {
    if (c.checkpoint_every == 0 && c.checkpoint_monitor.empty()) {
      return named(it->second, "checkpoint-async") +
             " applies only with --checkpoint-every or --checkpoint-monitor (it would be ignored)";
    }
    if (c.checkpoint_format == "full") {
      return named(it->second, "checkpoint-async") +
             " writes the sharded format (each rank its own file, no gather on rank 0); got --checkpoint-format "
             "full: use sharded or auto";
    }
  }
  for (const char* key : {"checkpoint-mode", "checkpoint-keep-best"}) {
    if (const auto it = given.find(key); it != given.end() && c.checkpoint_monitor.empty()) {
      return named(it->second, key) + " applies only with --checkpoint-monitor (it would be ignored)";
    }
  }
  for (const auto& [key, where] : given) {
    if (const auto who = strategy_ignores(key, c.strategy, strategies)) {
      return named(where, key) + " does not apply to strategy '" + c.strategy + "' (it would be ignored); it is for " +
             *who;
    }
    if (const auto why = data_ignores(key, c.data)) return named(where, key) + " would be ignored: " + *why;
    if (const auto why = precision_ignores(key, c)) {
      return named(where, key) + " would be ignored: " + *why;
    }
  }
  for (const char* key : {"fused-adamw", "adamw-kernel", "adam-beta1", "adam-beta2", "adam-eps"}) {
    if (const auto it = given.find(key); it != given.end() && c.optimizer != "adamw") {
      return named(it->second, key) + " does not apply to optimizer '" + c.optimizer +
             "' (it would be ignored); it is for adamw only";
    }
  }
  for (const char* key : {"momentum", "nesterov"}) {
    if (const auto it = given.find(key); it != given.end() && c.optimizer != "sgd") {
      return named(it->second, key) + " does not apply to optimizer '" + c.optimizer +
             "' (it would be ignored); it is for sgd only";
    }
  }
  if (const auto it = given.find("adamw-kernel"); it != given.end() && !c.fused_adamw) {
    return named(it->second, "adamw-kernel") + " does not apply with --fused-adamw false (it would be ignored)";
  }
  for (const char* key : {"lora-alpha", "lora-targets"}) {
    if (const auto it = given.find(key); it != given.end() && lora_off(c)) {
      return named(it->second, key) + " applies only with --lora-rank > 0 (it would be ignored)";
    }
  }
  if (!c.torchscript.empty()) {
    // The scripted model brings its own architecture and weights.
    std::vector<std::string> keys = {"preset", "init-from", "export-weights"};
    for (const ModelKey& m : models.options) keys.push_back(m.option.key());
    for (const std::string& key : keys) {
      if (const auto it = given.find(key); it != given.end()) {
        return named(it->second, key) +
               " does not apply with --torchscript (the scripted model defines the model and its weights)";
      }
    }
  }
  if (c.early_stopping_patience > 0 && (c.limit_val_batches == 0 || c.val_check_interval == 0)) {
    return "--early-stopping-patience " + format(c.early_stopping_patience) +
           " needs periodic validation (--val-check-interval > 0 and --limit-val-batches > 0; got " +
           format(c.val_check_interval) + " and " + format(c.limit_val_batches) + ")";
  }
  return "";
}

/// Options that contradict each other.
std::string check_conflicts(const RunConfig& c, const GivenKeys& given) {
  if (c.offload != "none" && c.checkpoint_async) {
    return "--checkpoint-async cannot be combined with --offload " + c.offload +
           ": its snapshot would bring the offloaded state back into memory (offloaded checkpoints are streamed "
           "synchronously)";
  }
  if (c.nesterov && c.momentum == 0.0) {
    return "--nesterov needs a momentum: give --momentum above 0 (got " + format(c.momentum) + ")";
  }
  if (c.offload != "none" && c.momentum > 0.0) {
    return "--offload " + c.offload + " streams AdamW's state or plain SGD; SGD with --momentum " + format(c.momentum) +
           " is not supported there (use --momentum 0, or --offload none)";
  }
  if (const auto it = given.find("init-std"); it != given.end() && !c.init_from.empty()) {
    return named(it->second, "init-std") + " does not apply with --init-from (the file gives every weight)";
  }
  if (!c.export_torchscript.empty() && c.torchscript.empty()) {
    return "--export-torchscript needs --torchscript (it saves the trained TorchScript model); for the GPT use "
           "--export-weights";
  }
  // The schedule's defaults adapt (min-lr is capped at lr; a warmup longer
  // than the run never ends); values given explicitly must make sense.
  if (given.count("min-lr") && c.min_lr > c.lr) {
    return "--min-lr " + format(c.min_lr) + " is above --lr " + format(c.lr) + "; the cosine decay ends at min-lr <= lr";
  }
  if (given.count("warmup-steps") && c.warmup_steps > c.max_steps) {
    return "--warmup-steps " + format(c.warmup_steps) + " is above --max-steps " + format(c.max_steps) +
           " (the warmup would never end); give at most " + format(c.max_steps);
  }
  // The model's own rules (n_embd and n_head, ...) are its family's: checked
  // when the registry resolves it, in phase 1 (recipes/models/spec.h).
  return "";
}

/// Each number within its range.
std::string check_ranges(const RunConfig& c) {
  std::string error;
  auto need = [&error](bool ok, const char* key, auto value, const std::string& rule) {
    if (!ok && error.empty()) error = "invalid value '" + format(value) + "' for --" + key + ": must be " + rule;
  };
  need(c.block_size >= 0, "block-size", c.block_size, ">= 0 (0: the data's)");
  need(c.vocab_size > 0, "vocab-size", c.vocab_size, "> 0");
  need(c.nproc >= 1, "nproc", c.nproc, ">= 1");
  need(c.tp_size >= 1, "tp-size", c.tp_size, ">= 1 (1: no tensor parallelism)");
  need(c.pp_size >= 1, "pp-size", c.pp_size, ">= 1 (1: no pipeline parallelism)");
  need(c.pp_virtual_stages >= 1, "pp-virtual-stages", c.pp_virtual_stages, ">= 1");
  need(c.nnodes >= 1, "nnodes", c.nnodes, ">= 1");
  need(c.node_rank >= 0 && c.node_rank < c.nnodes, "node-rank", c.node_rank,
       "in [0, nnodes) = [0, " + format(c.nnodes) + ")");
  need(c.nnodes == 1 || c.master_port > 0, "master-port", c.master_port,
       "> 0 with --nnodes > 1 (every node meets rank 0 there)");
  need(c.threads_per_rank >= 0, "threads-per-rank", c.threads_per_rank, ">= 0 (0: automatic)");
  need(c.master_port >= 0 && c.master_port <= 65535, "master-port", c.master_port,
       "in 0..65535 (0: none, for one machine)");
  // Counted in whole milliseconds, where 0 would mean no timeout at all.
  need(c.comm_timeout_s >= 0.001, "comm-timeout", c.comm_timeout_s, ">= 0.001 seconds (1 ms)");
  need(c.flight_recorder >= 0 && c.flight_recorder <= 1000000, "flight-recorder", c.flight_recorder,
       "in [0, 1000000] collectives (0: off)");
  need(c.activation_checkpointing >= 0, "activation-checkpointing", c.activation_checkpointing,
       ">= 0 (0: off, n: every n-th block)");
  need(c.max_steps > 0, "max-steps", c.max_steps, "> 0");
  need(c.batch_size > 0, "batch-size", c.batch_size, "> 0");
  need(c.accumulate_grad_batches > 0, "accumulate-grad-batches", c.accumulate_grad_batches, "> 0");
  need(c.lr > 0, "lr", c.lr, "> 0");
  need(c.min_lr >= 0, "min-lr", c.min_lr, ">= 0");
  need(c.warmup_steps >= 0, "warmup-steps", c.warmup_steps, ">= 0");
  need(c.weight_decay >= 0, "weight-decay", c.weight_decay, ">= 0");
  need(c.adam_beta1 >= 0 && c.adam_beta1 < 1, "adam-beta1", c.adam_beta1, "in [0, 1)");
  need(c.adam_beta2 >= 0 && c.adam_beta2 < 1, "adam-beta2", c.adam_beta2, "in [0, 1)");
  need(c.adam_eps > 0, "adam-eps", c.adam_eps, "> 0");
  need(c.momentum >= 0 && c.momentum < 1, "momentum", c.momentum, "in [0, 1)");
  need(c.gradient_clip_val >= 0, "gradient-clip-val", c.gradient_clip_val, ">= 0 (0: off)");
  need(c.log_every_n_steps > 0, "log-every-n-steps", c.log_every_n_steps, "> 0");
  need(c.val_check_interval >= 0, "val-check-interval", c.val_check_interval, ">= 0");
  need(c.limit_val_batches >= 0, "limit-val-batches", c.limit_val_batches, ">= 0");
  need(c.checkpoint_every >= 0, "checkpoint-every", c.checkpoint_every, ">= 0 (0: never)");
  need(c.checkpoint_keep >= 0, "checkpoint-keep", c.checkpoint_keep, ">= 0 (0: all)");
  need(c.checkpoint_keep_best >= 1, "checkpoint-keep-best", c.checkpoint_keep_best, ">= 1");
  need(c.early_stopping_patience >= 0, "early-stopping-patience", c.early_stopping_patience, ">= 0 (0: off)");
  need(std::isfinite(c.peak_flops) && c.peak_flops >= 0, "peak-flops", c.peak_flops,
       "a finite number >= 0 (0: measured once per machine)");
  need(c.loss_scale >= 0 && c.loss_scale <= 9.223372036854775808e18, "loss-scale", c.loss_scale,
       "in [0, 2^63] (0: dynamic)");
  need(c.initial_scale_power >= 0 && c.initial_scale_power <= 63, "initial-scale-power", c.initial_scale_power,
       "in [0, 63]");
  need(c.loss_scale_window >= 1, "loss-scale-window", c.loss_scale_window, ">= 1");
  need(c.hysteresis >= 1, "hysteresis", c.hysteresis, ">= 1");
  need(c.min_loss_scale > 0 &&
           (c.loss_scale > 0 ||
            std::ldexp(1.0, static_cast<int>(std::clamp<int64_t>(c.initial_scale_power, 0, 63))) >= c.min_loss_scale),
       "min-loss-scale", c.min_loss_scale,
       "> 0 and at most the initial scale 2^" + format(c.initial_scale_power));
  need(c.debug_overflow_step >= 0 && c.debug_overflow_step <= c.max_steps, "debug-overflow-step",
       c.debug_overflow_step, "in [0, max-steps " + format(c.max_steps) + "] (0: never)");
  return error;
}

}  // namespace

std::vector<std::string> optimizer_names() { return {"adamw", "sgd"}; }

std::vector<std::string> precision_names() {
  return {"32", "32-true", "fp32", "bf16-mixed", "bf16", "16-mixed", "fp16-mixed", "fp16"};
}

std::optional<std::string> precision_ignores(const std::string& key, const RunConfig& c) {
  static const char* const dynamic_keys[] = {"initial-scale-power", "loss-scale-window", "hysteresis",
                                             "consecutive-hysteresis", "min-loss-scale"};
  const bool fp16 = c.precision == "16-mixed" || c.precision == "fp16-mixed" || c.precision == "fp16";
  const bool dynamic_key = std::find(std::begin(dynamic_keys), std::end(dynamic_keys), key) != std::end(dynamic_keys);
  if (!fp16 && (dynamic_key || key == "loss-scale" || key == "debug-overflow-step")) {
    return "loss scaling is for --precision 16-mixed; precision " + c.precision + " needs none";
  }
  if (fp16 && dynamic_key && c.loss_scale > 0) {
    return "it tunes dynamic loss scaling, and --loss-scale " + format(c.loss_scale) + " is a static scale";
  }
  return std::nullopt;
}

std::optional<std::string> strategy_ignores(const std::string& key, const std::string& strategy,
                                            const StrategyRegistry& strategies) {
  const std::string who = strategies.declared_by(key);
  if (who.empty()) return std::nullopt;  // not a strategy option
  if (strategies.contains(strategy) && strategies.spec(strategy).find_option(key) != nullptr) return std::nullopt;
  return who;
}

std::optional<std::string> data_ignores(const std::string& key, const std::string& data) {
  const bool addition = data == "addition" || data.rfind("addition:", 0) == 0;
  std::error_code ec;
  if (key == "prompt-style" || key == "mask-prompt") {
    const std::string ext = std::filesystem::path(data).extension().string();
    if (ext != ".json" && ext != ".jsonl") {
      return "data '" + data + "' is not instruction data (.json or .jsonl records); " + key + " applies to it";
    }
    return std::nullopt;
  }
  if (key == "tokenizer" || key == "val-data") {
    if (addition) return "addition data ('" + data + "') has its own tokens; " + key + " applies to text data";
    if (std::filesystem::exists(std::filesystem::path(data) / "train.bin", ec)) {
      return "data '" + data + "' is a token directory (train.bin/val.bin), tokenized already; " + key +
             " applies to text data";
    }
    return std::nullopt;
  }
  if (key != "block-size" && key != "vocab-size") return std::nullopt;
  if (addition) {
    return "addition data ('" + data + "') has its own sequence length and vocabulary; " + key +
           " applies to a text file or token directory";
  }
  if (key == "vocab-size" && !std::filesystem::is_directory(data, ec)) {
    return "data '" + data + "' is not a token directory (train.bin/val.bin); a text file's vocabulary is its "
           "tokenizer's, or its 256 byte values";
  }
  return std::nullopt;
}

/// The chosen strategy's own options: each value by its rule, and the rules
/// between them (its spec's validate).
std::string check_strategy_options(const RunConfig& c, const StrategyRegistry& strategies) {
  if (!strategies.contains(c.strategy)) return "";  // auto: the planner picks a strategy and checks then
  try {
    strategy_args(c, strategies);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

std::string validate(const RunConfig& c, const ModelKeys& models, const StrategyRegistry& strategies,
                     const GivenKeys& given) {
  std::string error = check_choices(c, models.presets, strategies);
  if (error.empty()) error = check_ranges(c);
  if (error.empty()) error = check_ignored(c, models, given, strategies);
  if (error.empty()) error = check_strategy_options(c, strategies);
  if (error.empty()) error = check_conflicts(c, given);
  return error;
}

bool lora_off(const RunConfig& c) {
  const auto it = c.model_options.find("lora-rank");
  return it == c.model_options.end() || it->second == "0";
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace strata::recipes
