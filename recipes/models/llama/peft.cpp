#include "strata/recipes/models/llama/peft.h"

#include "strata/core/file_text.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::recipes {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// PEFT's target module names, in --lora-targets' order (q, k, v, o, gate, up, down).
constexpr const char* kModules[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
constexpr const char* kPrefix = "base_model.model.";

json read_json(const fs::path& path) {
  TORCH_CHECK_VALUE(fs::is_regular_file(path), path.string(),
                    ": cannot be read (a PEFT adapter directory holds adapter_config.json)");
  const std::string text = read_file_capped(path.string(), kMaxConfigFileBytes, "adapter_config.json");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK_VALUE(false, path.string(), ": not valid JSON (", e.what(), ")");
  }
  return {};
}

/// `key` absent, null or equal to `plain`: the options strata's LoRA has;
/// anything else is refused naming the key.
void require_plain(const json& c, const std::string& where, const std::string& key, const json& plain,
                   const std::string& why) {
  if (!c.contains(key) || c.at(key).is_null() || c.at(key) == plain) return;
  if (plain.is_object() && c.at(key).is_object() && c.at(key).empty()) return;
  TORCH_CHECK_VALUE(false, where, ": '", key, "' is ", c.at(key).dump(), "; strata reads ", plain.dump(), " (", why,
                    ")");
}

/// target_modules as --lora-targets' text: a list of q_proj..down_proj (or
/// their short names) or "all-linear".
std::string read_targets(const json& c, const std::string& where) {
  TORCH_CHECK_VALUE(c.contains("target_modules"), where, ": 'target_modules' is missing");
  const json& t = c.at("target_modules");
  if (t.is_string() && t.get<std::string>() == "all-linear") return "all";
  TORCH_CHECK_VALUE(t.is_array() && !t.empty(), where, ": 'target_modules' is ", t.dump(),
                    "; expected a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or "
                    "\"all-linear\"");
  std::string out;
  for (const auto& name : t) {
    const bool known = name.is_string() &&
                       std::any_of(std::begin(kModules), std::end(kModules),
                                   [&](const char* m) { return name.get<std::string>() == m; });
    TORCH_CHECK_VALUE(known, where, ": target module ", name.dump(),
                      " is not one strata adapts; allowed: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                      "down_proj");
    if (!out.empty()) out += ',';
    out += name.get<std::string>();
  }
  return out;
}

/// PEFT's key as strata's parameter name: base_model.model.X.lora_A.weight -> X_lora.A.
std::string strata_name(const std::string& key, const std::string& where) {
  const std::string prefix = kPrefix;
  constexpr size_t kSuffix = std::char_traits<char>::length(".lora_A.weight");
  const std::string suffix = key.size() > prefix.size() + kSuffix ? key.substr(key.size() - kSuffix) : "";
  const bool adapter = key.rfind(prefix, 0) == 0 && (suffix == ".lora_A.weight" || suffix == ".lora_B.weight");
  TORCH_CHECK_VALUE(adapter, where, ": holds ", json(key).dump(),
                    ", which is not a LoRA adapter's A or B (base_model.model.<module>.lora_A.weight)");
  return key.substr(prefix.size(), key.size() - prefix.size() - kSuffix) + "_lora." + suffix.substr(6, 1);
}

}  // namespace

PeftLora read_peft_lora(const std::string& dir) {
  const fs::path config_path = fs::path(dir) / "adapter_config.json";
  const std::string where = config_path.string();
  const json c = read_json(config_path);
  TORCH_CHECK_VALUE(c.is_object(), where, ": expected a JSON object, got ", std::string(c.type_name()));
  // Values as JSON in messages: any type, quoted and escaped (json::value would throw on a non-string).
  const json type = c.contains("peft_type") ? c.at("peft_type") : json();
  TORCH_CHECK_VALUE(type == "LORA", where, ": 'peft_type' is ", type.dump(), "; strata reads LORA adapters");
  for (const char* key : {"r", "lora_alpha"}) {
    TORCH_CHECK_VALUE(c.contains(key) && c.at(key).is_number() && c.at(key).get<double>() > 0, where, ": '", key,
                      "' must be a positive number, got ", c.contains(key) ? c.at(key).dump() : "nothing");
  }
  TORCH_CHECK_VALUE(c.at("r").is_number_integer() && c.at("r").get<double>() <= 65536, where,
                    ": 'r' must be a whole number from 1 to 65536, got ", c.at("r").dump());
  require_plain(c, where, "bias", "none", "adapters without biases");
  require_plain(c, where, "use_dora", false, "plain LoRA, not DoRA");
  require_plain(c, where, "fan_in_fan_out", false, "Linear layouts");
  require_plain(c, where, "modules_to_save", json::array(), "only adapters train");
  require_plain(c, where, "layers_to_transform", json::array(), "adapters on every layer");
  require_plain(c, where, "rank_pattern", json::object(), "one rank");
  require_plain(c, where, "alpha_pattern", json::object(), "one alpha");
  PeftLora out;
  out.rank = c.at("r").get<int64_t>();
  // rsLoRA scales by alpha / sqrt(r): strata's alpha / r with alpha * sqrt(r).
  const json rslora = c.contains("use_rslora") && !c.at("use_rslora").is_null() ? c.at("use_rslora") : json(false);
  TORCH_CHECK_VALUE(rslora.is_boolean(), where, ": 'use_rslora' must be true or false, got ", rslora.dump());
  const bool rs = rslora.get<bool>();
  out.alpha = c.at("lora_alpha").get<double>() * (rs ? std::sqrt(double(out.rank)) : 1.0);
  out.targets = read_targets(c, where);
  const fs::path weights = fs::path(dir) / "adapter_model.safetensors";
  TORCH_CHECK_VALUE(fs::exists(weights) || !fs::exists(fs::path(dir) / "adapter_model.bin"), dir,
                    ": holds adapter_model.bin (a pickle); strata reads adapter_model.safetensors (PEFT's default "
                    "since 0.6: save_pretrained(..., safe_serialization=True))");
  for (auto& [key, entry] : read_safetensors_header(weights.string())) {
    out.weights[strata_name(key, weights.string())] = entry;
  }
  return out;
}

void write_peft_lora(const std::string& dir, const std::map<std::string, torch::Tensor>& params,
                     const LlamaOptions& o, const std::string& base) {
  std::map<std::string, torch::Tensor> adapters;
  for (const auto& [name, t] : params) {
    const auto at = name.find("_lora.");
    if (at == std::string::npos) continue;
    adapters[kPrefix + name.substr(0, at) + ".lora_" + name.substr(at + 6) + ".weight"] =
        t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  }
  TORCH_CHECK_VALUE(!adapters.empty(), "format peft: the checkpoint holds no LoRA adapters");
  const auto t = parse_llama_lora_targets(o.lora_targets());
  const bool on[] = {t.q, t.k, t.v, t.o, t.gate, t.up, t.down};
  std::vector<std::string> targets;
  for (size_t i = 0; i < std::size(kModules); ++i) {
    if (on[i]) targets.push_back(kModules[i]);
  }
  fs::create_directories(dir);
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), adapters);
  const json config = {{"peft_type", "LORA"},    {"task_type", "CAUSAL_LM"},  {"r", o.lora_rank()},
                       {"lora_alpha", o.lora_alpha()}, {"lora_dropout", 0.0}, {"target_modules", targets},
                       {"bias", "none"},         {"fan_in_fan_out", false},   {"inference_mode", true},
                       {"use_rslora", false},    {"base_model_name_or_path", base}};
  std::ofstream((fs::path(dir) / "adapter_config.json").string()) << config.dump(2) << "\n";
}

}  // namespace strata::recipes
