#pragma once
// --config FILE for the configurations users already have: a DeepSpeed JSON
// (ds_config.json) or an Accelerate YAML (`accelerate config` output),
// translated into strata-gpt's own keys, which then apply as an INI's would
// (command-line flags still win).
//
// What strata supports is mapped (DeepSpeed: zero_optimization.stage 0-3 ->
// the registered strategy that says it stands for that stage
// (StrategySpec::deepspeed_zero_stage), offload_optimizer/offload_param, fp16/bf16,
// gradient_clipping, batch sizes, optimizer, scheduler, activation
// checkpointing; Accelerate: distributed_type (StrategySpec::accelerate_types) with fsdp_config or
// deepspeed_config, mixed_precision, machines and processes, use_cpu).
// Tuning knobs strata sizes itself (bucket sizes, prefetch depths, pinned
// buffers, ...) are accepted and listed in one note. Anything else - a key
// strata does not know, or a value it cannot honour - is an error naming the
// key, its value and what is allowed. The value "auto" (Hugging Face's "fill
// it in from the trainer") leaves the key to strata's flags and defaults.
#include "strata/strategies/registry.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::recipes {

struct ForeignConfig {
  /// strata-gpt keys (the INI / flag names) and their values, in file order.
  std::vector<std::pair<std::string, std::string>> keys;
  /// Accepted without effect, for one note at start ("ignored: ...").
  std::vector<std::string> ignored;
  /// An offload to "cpu" (host memory): a CPU device's state is already
  /// there, so such a run offloads nothing (said in a note) instead of
  /// refusing --offload cpu.
  bool host_offload = false;
  /// DeepSpeed's train_batch_size: micro-batch x accumulation x world must
  /// equal it (0: not given, or "auto").
  int64_t global_batch = 0;
};

/// True for the files this reads: .json, .yaml, .yml.
bool is_foreign_config(const std::string& path);

/// Reads and translates `path` (.json: DeepSpeed; .yaml/.yml: Accelerate).
/// Throws std::invalid_argument with one line naming the file, the key (as a
/// dotted path) and what is allowed.
ForeignConfig read_foreign_config(const std::string& path, const StrategyRegistry& strategies);

/// The translations themselves (exposed for tests). `file` names the source
/// in errors. Accelerate's deepspeed_config_file is opened as accelerate
/// opens it: relative to the working directory.
ForeignConfig translate_deepspeed(const nlohmann::json& config, const std::string& file,
                                  const StrategyRegistry& strategies);
ForeignConfig translate_accelerate(const nlohmann::json& config, const std::string& file,
                                   const StrategyRegistry& strategies);

namespace foreign {
// Shared by both translators (foreign_config.cpp).

/// Throws std::invalid_argument: "<file>: <key> <what>".
[[noreturn]] void fail(const std::string& file, const std::string& key, const std::string& what);
bool is_auto(const nlohmann::json& v);
/// The value as text for a strata key: numbers as written, bools true/false.
std::string text(const nlohmann::json& v, const std::string& file, const std::string& key);
/// A whole number (1e9 and 2.0 count), else an error naming the key.
int64_t whole(const nlohmann::json& v, const std::string& file, const std::string& key);
bool boolean(const nlohmann::json& v, const std::string& file, const std::string& key);
std::string string(const nlohmann::json& v, const std::string& file, const std::string& key);
/// An object (null and {} are empty objects), else an error naming the key.
const nlohmann::json& object(const nlohmann::json& v, const std::string& file, const std::string& key);
/// "a.b" from a prefix and a key.
std::string join_key(const std::string& prefix, const std::string& key);
/// The registered strategy standing for DeepSpeed's ZeRO `stage`; fails
/// (naming `key` and the stages strata maps) when none does.
std::string zero_stage_strategy(const StrategyRegistry& strategies, int64_t stage, const std::string& file,
                                const std::string& key);
/// The registered strategy standing for Accelerate's distributed_type
/// `type`; "" when none does.
std::string accelerate_strategy(const StrategyRegistry& strategies, const std::string& type);

}  // namespace foreign
}  // namespace strata::recipes
