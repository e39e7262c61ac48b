#include "strata/recipes/models/llama/hf_checkpoint.h"

#include "strata/core/atomic_file.h"
#include "strata/core/file_text.h"
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/llama/hf_config.h"

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace strata::recipes {
namespace {

namespace fs = std::filesystem;

/// A config.json or an index: capped (core/file_text.h).
std::string read_text(const fs::path& path) {
  return read_file_capped(path.string(), kMaxConfigFileBytes, path.filename().string());
}

/// The shard files an index names, each checked to be a plain file name in
/// `dir` (no path: an index may not reach outside its directory).
std::map<std::string, std::string> weight_map(const fs::path& dir) {
  const auto index_path = dir / "model.safetensors.index.json";
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text(index_path));
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, index_path.string(), ": not valid JSON (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                    index_path.string(), ": expected an object with a 'weight_map' object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : index["weight_map"].items()) {
    TORCH_CHECK_VALUE(file.is_string(), index_path.string(), ": weight_map['", name, "'] is not a file name");
    const auto f = file.get<std::string>();
    TORCH_CHECK_VALUE(!f.empty() && fs::path(f).filename().string() == f && f != "." && f != "..",
                      index_path.string(), ": weight_map['", name, "'] = '", f,
                      "' is not a file name in the directory");
    out[name] = f;
  }
  return out;
}

std::string dtype_name(torch::ScalarType t) {
  if (t == torch::kBFloat16) return "bfloat16";
  if (t == torch::kFloat16) return "float16";
  return "float32";
}

}  // namespace

bool is_hf_llama_dir(const std::string& dir) {
  const auto config = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(config)) return false;
  try {
    const auto c = nlohmann::json::parse(read_text(config));
    if (!c.is_object() || !c.contains("model_type") || !c["model_type"].is_string()) return false;
    const auto types = llama_model_types();
    return std::find(types.begin(), types.end(), c["model_type"].get<std::string>()) != types.end();
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

LlamaOptions read_hf_llama_options(const std::string& dir, int64_t block_size) {
  const auto config = fs::path(dir) / "config.json";
  TORCH_CHECK_VALUE(fs::is_regular_file(config), dir, ": no config.json (a transformers checkpoint directory has one)");
  return llama_options_from_hf_config(read_text(config), config.string(), block_size);
}

std::map<std::string, SafetensorsEntry> read_hf_entries(const std::string& dir_name) {
  const fs::path dir(dir_name);
  if (fs::is_regular_file(dir / "model.safetensors")) return read_safetensors_header((dir / "model.safetensors").string());
  TORCH_CHECK_VALUE(fs::is_regular_file(dir / "model.safetensors.index.json"), dir_name,
                    ": neither model.safetensors nor model.safetensors.index.json");
  const auto map = weight_map(dir);
  std::set<std::string> files;
  for (const auto& [name, file] : map) files.insert(file);
  std::map<std::string, SafetensorsEntry> out;
  for (const auto& file : files) {
    TORCH_CHECK_VALUE(fs::is_regular_file(dir / file), (dir / file).string(),
                      ": a shard model.safetensors.index.json names is missing");
    for (auto& [name, entry] : read_safetensors_header((dir / file).string())) {
      const auto it = map.find(name);
      TORCH_CHECK_VALUE(it != map.end() && it->second == file, (dir / file).string(), ": holds '", name,
                        "', which the index ", it == map.end() ? "does not name" : "places in " + it->second);
      out.emplace(name, std::move(entry));
    }
  }
  for (const auto& [name, file] : map) {
    TORCH_CHECK_VALUE(out.count(name), (dir / file).string(), ": lacks '", name, "', which the index places there");
  }
  return out;
}

std::map<std::string, torch::Tensor> read_hf_tensors(const std::string& dir) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, e] : read_hf_entries(dir)) {
    auto t = torch::empty(e.shape, torch::TensorOptions(e.dtype));
    read_safetensors_range(e, 0, e.numel(), t.view({-1}));
    out.emplace(name, std::move(t));
  }
  return out;
}

void load_llama_weights(LlamaModule& module, const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& where) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  for (auto& item : module.module().named_parameters()) {
    const auto it = tensors.find(item.key());
    TORCH_CHECK_VALUE(it != tensors.end(), where, ": lacks '", item.key(), "' ", item.value().sizes());
    TORCH_CHECK_VALUE(it->second.sizes() == item.value().sizes(), where, ": '", item.key(), "' has shape ",
                      it->second.sizes(), ", the config gives ", item.value().sizes());
    item.value().copy_(it->second);
    used.insert(item.key());
  }
  const bool tied = module.model()->options().tie_weights();
  for (const auto& [name, tensor] : tensors) {
    if (used.count(name) || (tied && name == "lm_head.weight") || name.find("rotary_emb.inv_freq") != std::string::npos) continue;
    TORCH_CHECK_VALUE(false, where, ": holds '", name, "', which a ", module.model()->options().model_type(),
                      " model with this config has not");
  }
}

std::unique_ptr<LlamaModule> load_hf_llama(const std::string& dir, int64_t block_size) {
  auto module = std::make_unique<LlamaModule>(read_hf_llama_options(dir, block_size));
  load_llama_weights(*module, read_hf_tensors(dir), dir);
  return module;
}

void write_hf_llama(const std::string& dir_name, const std::map<std::string, torch::Tensor>& tensors,
                    const LlamaOptions& options, int64_t max_shard_bytes) {
  const fs::path dir(dir_name);
  fs::create_directories(dir);
  TORCH_CHECK_VALUE(!tensors.empty(), "write_hf_llama: no tensors");
  // transformers' sharding: tensors in name order, a new shard when the next
  // would pass the limit.
  std::vector<std::map<std::string, torch::Tensor>> shards(1);
  int64_t bytes = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    if (bytes > 0 && bytes + size > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back()[name] = t;
    bytes += size;
    total += size;
  }
  const auto dtype = dtype_name(tensors.begin()->second.scalar_type());
  if (shards.size() == 1) {
    write_safetensors((dir / "model.safetensors").string(), shards[0]);
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    for (size_t i = 0; i < shards.size(); ++i) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      write_safetensors((dir / file).string(), shards[i]);
      for (const auto& [name, t] : shards[i]) index["weight_map"][name] = file;
    }
    write_file_atomically((dir / "model.safetensors.index.json").string(),
                          [&](std::ostream& out) { out << index.dump(2) << "\n"; });
  }
  write_file_atomically((dir / "config.json").string(),
                        [&](std::ostream& out) { out << llama_hf_config(options, dtype); });
}

}  // namespace strata::recipes
