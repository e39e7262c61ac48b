// The Accelerate translation (foreign_config.h): `accelerate config` YAML ->
// strata-gpt keys. distributed_type picks the strategy; fsdp_config maps onto
// strata's fsdp options; deepspeed_config is rewritten as a DeepSpeed JSON
// (or its deepspeed_config_file read) and translated as one.
#include "strata/core/file_text.h"
#include "strata/recipes/config/foreign_config.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>

namespace strata::recipes {

using nlohmann::json;
using namespace foreign;

namespace {

class Accelerate {
 public:
  Accelerate(std::string file, const StrategyRegistry& strategies) : file_(std::move(file)), strategies_(strategies) {}

  ForeignConfig translate(const json& config) {
    const json& top = object(config, file_, "the file");
    std::string type = "NO";
    int64_t processes = 1, machines = 1;
    json fsdp = json::object(), deepspeed = json::object();
    static const std::set<std::string> ignored = {"debug", "main_training_function", "same_network", "downcast_bf16",
                                                  "enable_cpu_affinity", "compute_environment_name"};
    for (const auto& [k, v] : top.items()) {
      if (k == "distributed_type") type = string(v, file_, k);
      else if (k == "num_processes") processes = whole(v, file_, k);
      else if (k == "num_machines") machines = whole(v, file_, k);
      else if (k == "machine_rank") set("node-rank", v, k);
      else if (k == "main_process_ip") set("master-addr", v, k);
      else if (k == "main_process_port") set("master-port", v, k);
      else if (k == "fsdp_config") fsdp = object(v, file_, k);
      else if (k == "deepspeed_config") deepspeed = object(v, file_, k);
      else if (k == "mixed_precision") mixed_precision(v);
      else if (k == "use_cpu") use_cpu(v);
      else if (k == "compute_environment") require(v, k, {"LOCAL_MACHINE"});
      else if (k == "rdzv_backend") require(v, k, {"static"});
      else if (k == "gpu_ids") require(v, k, {"all"});
      else if (k == "dynamo_backend") require(v, k, {"NO", "no"});
      else if (k == "tpu_env" || k == "tpu_use_cluster" || k == "tpu_use_sudo" || k == "tpu_name" || k == "tpu_zone" ||
               k == "megatron_lm_config" || k == "ipex_config" || k == "mpirun_config" || k == "dynamo_config" ||
               k == "commands" || k == "command_file") {
        must_be_off(v, k);
      } else if (ignored.count(k) != 0) {
        out_.ignored.push_back(k);
      } else {
        fail(file_, k, "(" + v.dump() + ") is not supported by strata; remove it, or run without --config");
      }
    }
    machines_and_processes(machines, processes);
    distributed_type(type, fsdp, deepspeed);
    return std::move(out_);
  }

 private:
  void set(const std::string& strata_key, const json& v, const std::string& key) {
    if (!v.is_null() && !is_auto(v)) out_.keys.emplace_back(strata_key, text(v, file_, key));
  }
  void require(const json& v, const std::string& key, const std::set<std::string>& allowed) {
    if (v.is_null()) return;
    const std::string s = text(v, file_, key);
    if (allowed.count(s) == 0) fail(file_, key, "'" + s + "' is not supported; strata runs with " + *allowed.begin());
    out_.ignored.push_back(key);
  }
  /// TPU, Megatron-LM, IPEX, MPI, dynamo: accepted only when off or empty.
  void must_be_off(const json& v, const std::string& key) {
    const bool off = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
                     (v.is_array() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
    if (!off && key == "mpirun_config") {
      fail(file_, key, "(" + v.dump() + ") is not supported: strata-gpt starts its own ranks on each machine "
           "(run it on every machine with its machine_rank); remove mpirun_config");
    }
    if (!off) fail(file_, key, "(" + v.dump() + ") is not supported by strata; it needs to be empty or false");
    out_.ignored.push_back(key);
  }

  void mixed_precision(const json& v) {
    const std::string m = text(v, file_, "mixed_precision");
    if (m == "no") precision_ = "32";
    else if (m == "bf16") precision_ = "bf16-mixed";
    else if (m == "fp16") precision_ = "16-mixed";
    else fail(file_, "mixed_precision", "'" + m + "' is not one of no, fp16, bf16");
    out_.keys.emplace_back("precision", *precision_);
  }

  void use_cpu(const json& v) {
    if (boolean(v, file_, "use_cpu")) out_.keys.emplace_back("device", "cpu");  // false: strata's auto (CUDA when usable)
  }

  /// Accelerate's num_processes counts every machine's; strata's --nproc is per machine.
  void machines_and_processes(int64_t machines, int64_t processes) {
    if (machines < 1) fail(file_, "num_machines", std::to_string(machines) + " must be >= 1");
    if (processes < 1 || processes % machines != 0) {
      fail(file_, "num_processes", std::to_string(processes) + " must be a positive multiple of num_machines (" +
           std::to_string(machines) + "): it counts the processes of every machine");
    }
    out_.keys.emplace_back("nproc", std::to_string(processes / machines));
    out_.keys.emplace_back("nnodes", std::to_string(machines));
  }

  void distributed_type(const std::string& type, const json& fsdp, const json& deepspeed) {
    if (type != "FSDP" && !fsdp.empty()) out_.ignored.push_back("fsdp_config (distributed_type is " + type + ")");
    if (type != "DEEPSPEED" && !deepspeed.empty()) out_.ignored.push_back("deepspeed_config (distributed_type is " + type + ")");
    if (type == "DEEPSPEED") return deepspeed_config(deepspeed);  // the strategy by its ZeRO stage
    const std::string strategy = accelerate_strategy(strategies_, type);
    if (strategy.empty()) {
      std::string mapped;
      for (const auto* spec : strategies_.specs()) {
        for (const auto& t : spec->accelerate_types()) mapped += t + ", ";
      }
      fail(file_, "distributed_type", "'" + type + "' is not supported; strata maps " + mapped + "DEEPSPEED");
    }
    out_.keys.emplace_back("strategy", strategy);
    // fsdp_config holds the FSDP plugin's keys, translated into the options
    // of the strategy that stands for FSDP.
    fsdp_strategy_ = strategy;
    if (type == "FSDP") fsdp_config(fsdp);
  }

  void fsdp_config(const json& c);
  /// `strata_key` = `value` for the strategy standing for FSDP; an error naming
  /// `key` when its spec has no such option.
  void fsdp_option(const std::string& strata_key, const std::string& value, const std::string& key) {
    if (strategies_.spec(fsdp_strategy_).find_option(strata_key) == nullptr) {
      fail(file_, key, "has no counterpart: strategy " + fsdp_strategy_ + ", which stands for FSDP, has no --" +
                           strata_key);
    }
    out_.keys.emplace_back(strata_key, value);
  }
  void sharding_strategy(const json& v, const std::string& key);
  void deepspeed_config(const json& c);

  std::string file_;
  const StrategyRegistry& strategies_;
  std::string fsdp_strategy_;  ///< the registered strategy standing for FSDP
  ForeignConfig out_;
  std::optional<std::string> precision_;  // from mixed_precision
};

/// An enum given as its name or as torch's number (older accelerate wrote 1..4).
std::string enum_name(const json& v, const std::vector<std::string>& names, const std::string& file, const std::string& key) {
  if (v.is_number()) {
    const int64_t i = whole(v, file, key);
    if (i >= 1 && i <= static_cast<int64_t>(names.size())) return names[i - 1];
  }
  return text(v, file, key);
}

void Accelerate::sharding_strategy(const json& v, const std::string& key) {
  const std::string s = enum_name(v, {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"}, file_, key);
  if (s != "FULL_SHARD" && s != "SHARD_GRAD_OP" && s != "NO_SHARD" && s != "HYBRID_SHARD") {
    fail(file_, key, "'" + s + "' is not supported; strata has FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
  }
  std::string lower = s;
  for (auto& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  fsdp_option("sharding-strategy", lower, key);
}

void Accelerate::fsdp_config(const json& c) {
  for (const auto& [k, v] : c.items()) {
    const std::string key = "fsdp_config." + k;
    if (k == "fsdp_sharding_strategy") {
      sharding_strategy(v, key);
    } else if (k == "fsdp_auto_wrap_policy") {
      const std::string s = text(v, file_, key);
      if (s == "TRANSFORMER_BASED_WRAP") fsdp_option("wrap-policy", "block", key);
      else if (s == "NO_WRAP") fsdp_option("wrap-policy", "none", key);
      else fail(file_, key, "'" + s + "' is not supported; strata wraps each transformer block (TRANSFORMER_BASED_WRAP) or nothing (NO_WRAP)");
    } else if (k == "fsdp_transformer_layer_cls_to_wrap") {
      out_.ignored.push_back(key + " (strata-gpt wraps its transformer blocks)");
    } else if (k == "fsdp_backward_prefetch" || k == "fsdp_backward_prefetch_policy") {
      const std::string s = enum_name(v, {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}, file_, key);
      if (s != "BACKWARD_PRE") fail(file_, key, "'" + s + "' is not supported; strata prefetches the next unit before each unit's backward (BACKWARD_PRE)");
    } else if (k == "fsdp_forward_prefetch") {
      boolean(v, file_, key);
      out_.ignored.push_back(key + " (strata prefetches the next unit in forward)");
    } else if (k == "fsdp_offload_params") {
      if (boolean(v, file_, key)) {
        out_.keys.emplace_back("offload", "cpu");
        out_.host_offload = true;
      }
    } else if (k == "fsdp_state_dict_type") {
      const std::string s = enum_name(v, {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, file_, key);
      if (s == "FULL_STATE_DICT") out_.keys.emplace_back("checkpoint-format", "full");
      else if (s == "SHARDED_STATE_DICT") out_.keys.emplace_back("checkpoint-format", "sharded");
      else fail(file_, key, "'" + s + "' is not supported; strata writes FULL_STATE_DICT or SHARDED_STATE_DICT checkpoints");
    } else if (k == "fsdp_activation_checkpointing") {
      out_.keys.emplace_back("activation-checkpointing", boolean(v, file_, key) ? "1" : "0");
    } else if (k == "fsdp_reshard_after_forward" && v.is_boolean()) {
      fsdp_option("reshard-after-forward", v.get<bool>() ? "true" : "false", key);  // FSDP2's flag
    } else if (k == "fsdp_reshard_after_forward") {
      // accelerate >= 1.6 writes FSDP1's sharding strategy under this name.
      sharding_strategy(v, key);
    } else if (k == "fsdp_cpu_ram_efficient_loading" || k == "fsdp_sync_module_states" || k == "fsdp_use_orig_params" ||
               k == "fsdp_version") {
      // strata always builds units one at a time from rank 0's values, and
      // shards per parameter (frozen and trainable mix in a unit).
      out_.ignored.push_back(key);
    } else {
      fail(file_, key, "(" + v.dump() + ") is not supported by strata; remove it, or run without --config");
    }
  }
}

void Accelerate::deepspeed_config(const json& c) {
  // Either a whole DeepSpeed JSON (deepspeed_config_file) or accelerate's
  // own handful of keys, rewritten as one.
  json ds = json::object();
  json zero = json::object();  // accelerate's own keys, a zero_optimization block
  bool from_file = false;
  for (const auto& [k, v] : c.items()) {
    const std::string key = "deepspeed_config." + k;
    if (k == "deepspeed_config_file") {
      // As accelerate opens it: relative to the working directory.
      const std::filesystem::path path = string(v, file_, key);
      // Capped: the name comes from the YAML, and a device or a huge file is no DeepSpeed config.
      std::string text;
      try {
        text = read_file_capped(path.string(), kMaxConfigFileBytes, "DeepSpeed config");
      } catch (const c10::ValueError& e) {
        fail(file_, key, e.what_without_backtrace());
      }
      try {
        ds = json::parse(text);
      } catch (const json::exception& e) {
        fail(file_, key, "'" + path.string() + "' is not valid JSON: " + e.what());
      }
      if (!ds.is_object()) fail(file_, key, "'" + path.string() + "' is not a DeepSpeed config (a JSON object)");
      from_file = true;
    } else if (k == "zero_stage") {
      zero["stage"] = v;
    } else if (k == "offload_optimizer_device") {
      zero["offload_optimizer"]["device"] = v;
    } else if (k == "offload_param_device") {
      zero["offload_param"]["device"] = v;
    } else if (k == "offload_optimizer_nvme_path") {
      zero["offload_optimizer"]["nvme_path"] = v;
    } else if (k == "offload_param_nvme_path") {
      zero["offload_param"]["nvme_path"] = v;
    } else if (k == "gradient_accumulation_steps" || k == "gradient_clipping") {
      ds[k] = v;
    } else if (k == "zero3_init_flag" || k == "zero3_save_16bit_model" || k == "deepspeed_multinode_launcher") {
      out_.ignored.push_back(key);
    } else {
      fail(file_, key, "(" + v.dump() + ") is not supported by strata; remove it, or run without --config");
    }
  }
  if (!from_file) {
    // accelerate's DeepSpeedPlugin: ZeRO stage 2 unless zero_stage says otherwise.
    if (!zero.contains("stage")) zero["stage"] = 2;
    ds["zero_optimization"] = zero;
  } else if (!zero.empty()) {
    fail(file_, "deepspeed_config", "gives both deepspeed_config_file and zero_* keys; accelerate takes one or the other");
  }
  ForeignConfig inner = translate_deepspeed(ds, file_ + " (deepspeed_config)", strategies_);
  for (const auto& [k, v] : inner.keys) {
    // accelerate refuses a mixed_precision its DeepSpeed config contradicts.
    if (k == "precision" && precision_ && *precision_ != v) {
      fail(file_, "mixed_precision", "('" + *precision_ + "') disagrees with the DeepSpeed config's fp16/bf16 ('" + v + "')");
    }
  }
  out_.keys.insert(out_.keys.end(), inner.keys.begin(), inner.keys.end());
  out_.ignored.insert(out_.ignored.end(), inner.ignored.begin(), inner.ignored.end());
  out_.host_offload = out_.host_offload || inner.host_offload;
  out_.global_batch = inner.global_batch;
}

}  // namespace

ForeignConfig translate_accelerate(const json& config, const std::string& file, const StrategyRegistry& strategies) {
  return Accelerate(file, strategies).translate(config);
}

}  // namespace strata::recipes
