// Reading --config's DeepSpeed JSON / Accelerate YAML and the DeepSpeed
// translation (foreign_config.h). Accelerate's is in accelerate_config.cpp,
// the helpers both share in foreign_values.cpp.
#include "strata/recipes/config/foreign_config.h"

#include "strata/core/file_text.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

namespace strata::recipes {

using nlohmann::json;

namespace {

using namespace foreign;

/// A YAML node as JSON: plain scalars typed as YAML 1.2's core schema reads
/// them (true/false, null/~, integers, floats), quoted ones kept as strings
/// ('no', "NO", '1234' stay text).
json to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: return nullptr;
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(to_json(item));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& item : node) out[item.first.as<std::string>()] = to_json(item.second);
      return out;
    }
    case YAML::NodeType::Scalar: break;
  }
  const std::string s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == "null" || s == "Null" || s == "NULL" || s == "~") return nullptr;
  try {
    size_t used = 0;
    const long long i = std::stoll(s, &used);
    if (used == s.size()) return static_cast<int64_t>(i);
    const double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

/// The DeepSpeed translation, one method per block.
class DeepSpeed {
 public:
  DeepSpeed(std::string file, const StrategyRegistry& strategies) : file_(std::move(file)), strategies_(strategies) {}

  ForeignConfig translate(const json& config) {
    const json& top = object(config, file_, "the file");
    bool zero = false;
    for (const auto& [k, v] : top.items()) {
      if (k == "train_micro_batch_size_per_gpu") {
        set("batch-size", v, k);
      } else if (k == "gradient_accumulation_steps") {
        set("accumulate-grad-batches", v, k);
      } else if (k == "train_batch_size") {
        if (!is_auto(v)) out_.global_batch = whole(v, file_, k);
      } else if (k == "gradient_clipping") {
        set("gradient-clip-val", v, k);
      } else if (k == "zero_optimization") {
        zero_optimization(object(v, file_, k));
        zero = true;
      } else if (k == "fp16") {
        fp16(object(v, file_, k));
      } else if (k == "bf16" || k == "bfloat16") {
        bf16(object(v, file_, k), k);
      } else if (k == "optimizer") {
        optimizer(object(v, file_, k));
      } else if (k == "scheduler") {
        scheduler(object(v, file_, k));
      } else if (k == "activation_checkpointing") {
        activation_checkpointing(object(v, file_, k));
      } else if (k == "prescale_gradients") {
        // Divide before or after the reduction: strata's strategies average
        // gradients their own way (ddp divides first, fsdp after), as exact in fp32.
        boolean(v, file_, k);
        out_.ignored.push_back(k + " (strata averages gradients itself)");
      } else if (k == "steps_per_print" || k == "wall_clock_breakdown" || k == "zero_allow_untested_optimizer" || k == "memory_breakdown" ||
                 k == "zero_force_ds_cpu_optimizer" || k == "dump_state") {
        out_.ignored.push_back(k);
      } else {
        unsupported(k, v);
      }
    }
    // DeepSpeed's default: stage 0, data parallel.
    if (!zero) out_.keys.emplace_back("strategy", zero_stage_strategy(strategies_, 0, file_, "zero_optimization.stage"));
    check_precision();
    return std::move(out_);
  }

 private:
  void set(const std::string& strata_key, const json& v, const std::string& key) {
    if (!is_auto(v)) out_.keys.emplace_back(strata_key, text(v, file_, key));
  }
  /// `strata_key` for `strategy` when its spec declares it; else the key is
  /// listed as accepted without effect.
  void strategy_option(const std::string& strategy, const std::string& strata_key, const json& v,
                       const std::string& key) {
    if (strategies_.spec(strategy).find_option(strata_key) != nullptr) return set(strata_key, v, key);
    out_.ignored.push_back(key + " (strategy " + strategy + " has no --" + strata_key + ")");
  }
  [[noreturn]] void unsupported(const std::string& key, const json& v) {
    fail(file_, key, "(" + v.dump() + ") is not supported by strata; remove it, or run without --config");
  }

  void zero_optimization(const json& z) {
    const std::string p = "zero_optimization";
    int64_t stage = 0;
    std::string opt_device = "none", param_device = "none", opt_path, param_path;
    const json *overlap = nullptr, *unused = nullptr;
    static const std::set<std::string> tuning = {
        "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "allgather_partitions", "reduce_scatter",
        "round_robin_gradients", "sub_group_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "memory_efficient_linear", "load_from_fp32_weights",
        "elastic_checkpoint", "aio", "stage3_module_granularity_threshold"};
    for (const auto& [k, v] : z.items()) {
      const std::string key = join_key(p, k);
      if (k == "stage") {
        stage = whole(v, file_, key);
        zero_stage_strategy(strategies_, stage, file_, key);  // fails for a stage no strategy stands for
      } else if (k == "offload_optimizer") {
        offload_block(object(v, file_, key), key, opt_device, opt_path);
      } else if (k == "offload_param") {
        offload_block(object(v, file_, key), key, param_device, param_path);
      } else if (k == "overlap_comm") {
        overlap = &v;
      } else if (k == "ignore_unused_parameters") {
        unused = &v;
      } else if (tuning.count(k) != 0) {
        out_.ignored.push_back(key);
      } else {
        unsupported(key, v);
      }
    }
    const std::string strategy = zero_stage_strategy(strategies_, stage, file_, p + ".stage");
    out_.keys.emplace_back("strategy", strategy);
    // Where the strategy has the option (ddp can turn the overlap off; the
    // sharded ones always overlap, so for them the key has no effect).
    if (overlap != nullptr) strategy_option(strategy, "overlap-comm", *overlap, p + ".overlap_comm");
    if (unused != nullptr) strategy_option(strategy, "find-unused-parameters", *unused, p + ".ignore_unused_parameters");
    offload(stage, opt_device, opt_path, param_device, param_path);
  }

  void offload_block(const json& block, const std::string& p, std::string& device, std::string& path) {
    for (const auto& [k, v] : block.items()) {
      const std::string key = join_key(p, k);
      if (k == "device") {
        device = is_auto(v) || v.is_null() ? "none" : string(v, file_, key);
        if (device != "none" && device != "cpu" && device != "nvme") fail(file_, key, "'" + device + "' is not one of none, cpu, nvme");
      } else if (k == "nvme_path") {
        path = string(v, file_, key);
      } else if (k == "pin_memory" || k == "buffer_count" || k == "buffer_size" || k == "max_in_cpu" ||
                 k == "fast_init" || k == "pipeline_read" || k == "pipeline_write") {
        out_.ignored.push_back(key);
      } else {
        unsupported(key, v);
      }
    }
  }

  /// DeepSpeed offloads the optimizer (stages 0-3) and the parameters (stage
  /// 3); strata's --offload keeps the optimizer state (ddp/oss/sdp) or
  /// everything fsdp shards in one tier, so under stage 3 both must agree.
  void offload(int64_t stage, const std::string& opt, const std::string& opt_path, const std::string& param,
               const std::string& param_path) {
    const std::string p = "zero_optimization.";
    if (stage < 3 && param != "none") {
      fail(file_, p + "offload_param.device", "'" + param + "' needs stage 3 (DeepSpeed offloads parameters only under ZeRO-3)");
    }
    if (stage == 3 && opt != param) {
      fail(file_, p + "offload_param.device", "'" + param + "' differs from offload_optimizer.device '" + opt +
           "'; strata's ZeRO-3 strategy offloads parameter shards, gradients and optimizer state together: give both the same device");
    }
    if (opt == "none") return;
    if (opt == "cpu") {
      out_.keys.emplace_back("offload", "cpu");
      out_.host_offload = true;
      return;
    }
    const std::string path = opt_path.empty() ? param_path : opt_path;
    if (path.empty()) fail(file_, p + "offload_optimizer.nvme_path", "is missing; device 'nvme' needs a directory");
    if (stage == 3 && !param_path.empty() && param_path != path) {
      fail(file_, p + "offload_param.nvme_path", "'" + param_path + "' differs from offload_optimizer.nvme_path '" + path +
           "'; strata keeps both in one directory");
    }
    out_.keys.emplace_back("offload", "disk");
    out_.keys.emplace_back("offload-dir", path);
  }

  void fp16(const json& block) {
    bool enabled = false;
    std::vector<std::pair<std::string, std::string>> scaler;
    for (const auto& [k, v] : block.items()) {
      const std::string key = join_key("fp16", k);
      if (k == "enabled") {
        enabled = !is_auto(v) && boolean(v, file_, key);
      } else if (k == "loss_scale" || k == "initial_scale_power" || k == "loss_scale_window" || k == "hysteresis" ||
                 k == "min_loss_scale" || k == "consecutive_hysteresis") {
        std::string strata_key = k;
        for (auto& c : strata_key) c = c == '_' ? '-' : c;
        const bool flag = k == "consecutive_hysteresis";
        if (!is_auto(v) && (flag ? !v.is_boolean() : !v.is_number())) {
          fail(file_, key, "is " + v.dump() + "; expected " + (flag ? "true or false" : "a number"));
        }
        if (!is_auto(v)) scaler.emplace_back(strata_key, text(v, file_, key));
      } else if (k == "auto_cast") {
        out_.ignored.push_back(key);
      } else {
        unsupported(key, v);
      }
    }
    if (!enabled) {
      // Not on (or "auto"): the scaler settings have nothing to apply to.
      if (!scaler.empty()) out_.ignored.push_back("fp16 (not enabled)");
      return;
    }
    fp16_ = true;
    out_.keys.emplace_back("precision", "16-mixed");
    // A static scale (loss_scale > 0) makes DeepSpeed ignore the dynamic
    // settings; strata refuses them beside one, so they are dropped here.
    bool fixed = false;
    for (const auto& [k, v] : scaler) fixed = fixed || (k == "loss-scale" && std::stod(v) != 0.0);
    for (const auto& [k, v] : scaler) {
      std::string name = k;
      for (auto& c : name) c = c == '-' ? '_' : c;
      if (fixed && k != "loss-scale") out_.ignored.push_back("fp16." + name + " (a static loss_scale is set)");
      else out_.keys.emplace_back(k, v);
    }
  }

  void bf16(const json& block, const std::string& name) {
    for (const auto& [k, v] : block.items()) {
      const std::string key = join_key(name, k);
      if (k == "enabled") {
        bf16_ = !is_auto(v) && boolean(v, file_, key);
      } else if (k == "immediate_grad_update" || k == "check_grad_overflow") {
        out_.ignored.push_back(key);
      } else if (k == "loss_scale" || k == "loss_scale_window" || k == "hysteresis" || k == "min_loss_scale" ||
                 k == "initial_scale_power" || k == "consecutive_hysteresis") {
        // fp16's loss-scaling keys, copied into a bf16 block: DeepSpeed's bf16
        // has no loss scaling (bf16 has fp32's range) and reads none of them.
        out_.ignored.push_back(key + " (bf16 needs no loss scaling)");
      } else {
        unsupported(key, v);
      }
    }
    if (bf16_) out_.keys.emplace_back("precision", "bf16-mixed");
  }

  void check_precision() const {
    if (fp16_ && bf16_) fail(file_, "fp16.enabled", "and bf16.enabled are both true; enable one");
  }

  void optimizer(const json& block);
  void scheduler(const json& block);
  void activation_checkpointing(const json& block);

  std::string file_;
  const StrategyRegistry& strategies_;
  ForeignConfig out_;
  bool fp16_ = false, bf16_ = false;
  std::optional<double> lr_;  // optimizer.params.lr (scheduler ratios need it)
};

void DeepSpeed::optimizer(const json& block) {
  std::string type;
  json params = json::object();
  for (const auto& [k, v] : block.items()) {
    if (k == "type") type = is_auto(v) ? "" : string(v, file_, "optimizer.type");
    else if (k == "params") params = object(v, file_, "optimizer.params");
    else unsupported("optimizer." + k, v);
  }
  std::string lower = type;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (its FusedAdam default).
  if (lower == "adam" || lower == "adamw") {
    out_.keys.emplace_back("optimizer", "adamw");
  } else if (lower == "sgd") {
    out_.keys.emplace_back("optimizer", "sgd");
  } else if (!lower.empty()) {
    fail(file_, "optimizer.type", "'" + type + "' is not supported; strata has Adam/AdamW (decoupled weight decay) and SGD");
  }
  for (const auto& [k, v] : params.items()) {
    const std::string key = "optimizer.params." + k;
    if (is_auto(v)) continue;
    if (k == "lr") {
      if (!v.is_number()) fail(file_, key, "is " + v.dump() + "; expected a number or \"auto\"");
      lr_ = v.get<double>();
      out_.keys.emplace_back("lr", text(v, file_, key));
    } else if (k == "weight_decay") {
      set("weight-decay", v, key);
    } else if ((k == "betas" || k == "eps") && lower == "sgd") {
      out_.ignored.push_back(key + " (SGD reads no " + k + ")");
    } else if ((k == "momentum" || k == "nesterov" || k == "dampening") && (lower == "adam" || lower == "adamw")) {
      out_.ignored.push_back(key + " (Adam reads no " + k + ")");
    } else if (k == "betas") {
      if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
        fail(file_, key, "is " + v.dump() + "; expected two numbers [beta1, beta2]");
      }
      out_.keys.emplace_back("adam-beta1", text(v[0], file_, key + "[0]"));
      out_.keys.emplace_back("adam-beta2", text(v[1], file_, key + "[1]"));
    } else if (k == "eps") {
      set("adam-eps", v, key);
    } else if (k == "adam_w_mode") {
      if (!boolean(v, file_, key)) fail(file_, key, "false (Adam with L2 decay) is not supported; strata's adamw decouples weight decay");
    } else if (k == "momentum") {
      set("momentum", v, key);
    } else if (k == "nesterov") {
      boolean(v, file_, key);
      set("nesterov", v, key);
    } else if (k == "dampening") {
      if (!v.is_number() || v.get<double>() != 0.0) fail(file_, key, v.dump() + " is not supported; strata's sgd has dampening 0");
    } else if (k == "torch_adam") {
      out_.ignored.push_back(key);
    } else {
      unsupported(key, v);
    }
  }
}

void DeepSpeed::scheduler(const json& block) {
  std::string type;
  json params = json::object();
  for (const auto& [k, v] : block.items()) {
    if (k == "type") type = string(v, file_, "scheduler.type");
    else if (k == "params") params = object(v, file_, "scheduler.params");
    else unsupported("scheduler." + k, v);
  }
  bool all_auto = true;
  for (const auto& [k, v] : params.items()) all_auto = all_auto && is_auto(v);
  if (all_auto) {
    // Hugging Face fills these from its own arguments; here strata's flags
    // (--lr, --warmup-steps, --min-lr: warm-up then cosine decay) do.
    out_.ignored.push_back("scheduler (" + type + ", every parameter \"auto\": strata's --lr/--warmup-steps/--min-lr schedule)");
    return;
  }
  // strata's schedule: linear warm-up from 0, then cosine decay to --min-lr.
  auto param = [&](const std::string& k) -> const json* {
    auto it = params.find(k);
    return it == params.end() || is_auto(*it) ? nullptr : &*it;
  };
  for (const auto& [k, v] : params.items()) {
    static const std::set<std::string> known = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                                "total_num_steps", "cos_min_ratio", "warmup_min_ratio"};
    if (known.count(k) == 0) unsupported("scheduler.params." + k, v);
  }
  if (const json* w = param("warmup_min_lr"); w != nullptr && (!w->is_number() || w->get<double>() != 0.0)) {
    fail(file_, "scheduler.params.warmup_min_lr", w->dump() + " is not supported; strata warms up from 0");
  }
  if (const json* w = param("warmup_min_ratio"); w != nullptr && (!w->is_number() || w->get<double>() != 0.0)) {
    fail(file_, "scheduler.params.warmup_min_ratio", w->dump() + " is not supported; strata warms up from 0");
  }
  if (const json* w = param("warmup_type"); w != nullptr && string(*w, file_, "scheduler.params.warmup_type") != "linear") {
    fail(file_, "scheduler.params.warmup_type", w->dump() + " is not supported; strata's warm-up is linear");
  }
  for (const char* k : {"warmup_max_lr", "warmup_num_steps", "total_num_steps", "cos_min_ratio"}) {
    if (const json* w = param(k); w != nullptr && !w->is_number()) {
      fail(file_, std::string("scheduler.params.") + k, "is " + w->dump() + "; expected a number or \"auto\"");
    }
  }
  if (const json* w = param("warmup_num_steps")) set("warmup-steps", *w, "scheduler.params.warmup_num_steps");
  if (type == "WarmupLR") {
    // Constant after the warm-up: the decay ends where it starts. DeepSpeed's
    // defaults: warmup_max_lr 0.001, warmup_type "log" (strata's is linear).
    const json* peak = param("warmup_max_lr");
    const std::string lr = peak != nullptr ? text(*peak, file_, "scheduler.params.warmup_max_lr") : "0.001";
    out_.keys.emplace_back("lr", lr);
    out_.keys.emplace_back("min-lr", lr);
    if (param("warmup_type") == nullptr) out_.ignored.push_back("scheduler.params.warmup_type (DeepSpeed's default log; strata warms up linearly)");
  } else if (type == "WarmupCosineLR") {
    // strata's cosine decays over --max-steps: total_num_steps sets it.
    if (const json* total = param("total_num_steps")) set("max-steps", *total, "scheduler.params.total_num_steps");
    if (const json* ratio = param("cos_min_ratio")) {
      if (!lr_) fail(file_, "scheduler.params.cos_min_ratio", "needs optimizer.params.lr as a number (the ratio is of it)");
      out_.keys.emplace_back("min-lr", text(json(*lr_ * ratio->get<double>()), file_, "scheduler.params.cos_min_ratio"));
    }
  } else {
    fail(file_, "scheduler.type", "'" + type + "' is not supported; strata maps WarmupLR and WarmupCosineLR "
         "(its schedule is a linear warm-up then a cosine decay)");
  }
}

void DeepSpeed::activation_checkpointing(const json& block) {
  for (const auto& [k, v] : block.items()) {
    const std::string key = join_key("activation_checkpointing", k);
    if ((k == "partition_activations" || k == "cpu_checkpointing") && !v.is_null() && boolean(v, file_, key)) {
      fail(file_, key, "true is not supported; strata recomputes each block from its input kept in memory");
    } else if (k == "partition_activations" || k == "cpu_checkpointing" || k == "contiguous_memory_optimization" ||
               k == "number_checkpoints" || k == "synchronize_checkpoint_boundary" || k == "profile") {
      out_.ignored.push_back(key);
    } else {
      unsupported(key, v);
    }
  }
  out_.keys.emplace_back("activation-checkpointing", "1");  // every block
}

}  // namespace

ForeignConfig translate_deepspeed(const json& config, const std::string& file, const StrategyRegistry& strategies) {
  return DeepSpeed(file, strategies).translate(config);
}

bool is_foreign_config(const std::string& path) {
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".json" || ext == ".yaml" || ext == ".yml";
}

namespace {
/// The translations name the key in every error they raise; a json type
/// error that slips past them still becomes one line naming the file.
template <typename Fn>
ForeignConfig guarded(const std::string& file, Fn&& translate) {
  try {
    return translate();
  } catch (const json::exception& e) {
    throw std::invalid_argument(file + ": " + e.what());
  }
}
}  // namespace

namespace {
ForeignConfig read_and_translate(const std::string& path, const StrategyRegistry& strategies) {
  const std::string file = "config file '" + path + "'";
  std::stringstream buffer;
  try {
    buffer << read_file_capped(path, kMaxConfigFileBytes, "config file");
  } catch (const c10::ValueError& e) {  // this reader's errors are std::invalid_argument
    throw std::invalid_argument("config file " + std::string(e.what_without_backtrace()));
  }
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".json") {
    json config;
    try {
      config = json::parse(buffer.str());
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number like 1e999
      throw std::invalid_argument(file + ": not valid JSON: " + e.what());
    }
    return guarded(file, [&] { return translate_deepspeed(config, file, strategies); });
  }
  json config;
  try {
    config = to_json(YAML::Load(buffer.str()));
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(file + ": not valid YAML: " + e.what());
  }
  return guarded(file, [&] { return translate_accelerate(config, file, strategies); });
}

}  // namespace

ForeignConfig read_foreign_config(const std::string& path, const StrategyRegistry& strategies) {
  try {
    return read_and_translate(path, strategies);
  } catch (const std::invalid_argument& e) {
    // Keys and values come from the file, and parsers quote the byte they
    // stopped at: control bytes escaped, the error stays one line.
    throw std::invalid_argument(control_escaped(e.what()));
  }
}

}  // namespace strata::recipes
