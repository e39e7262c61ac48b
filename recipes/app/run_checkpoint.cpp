#include "strata/recipes/app/run_checkpoint.h"

#include "strata/callbacks/model_checkpoint.h"
#include "strata/recipes/app/run_checks.h"
#include "strata/trainer/checkpoint.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace strata::recipes {
namespace {
namespace fs = std::filesystem;

/// The checkpoint `path` names: itself, or an output directory's newest.
std::string checkpoint_of(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "metadata.json", ec)) return path;
  const auto newest = latest_checkpoint((fs::path(path) / "checkpoints").string());
  if (!newest.empty()) return newest;
  return path;  // read_checkpoint_tensors says why it is not a checkpoint
}

/// <output dir>/config.ini beside <output dir>/checkpoints/step-N.
fs::path config_beside(const std::string& checkpoint) {
  fs::path dir = fs::absolute(checkpoint).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "…/step-4/"
  return dir.parent_path().parent_path() / "config.ini";
}

/// The value config.ini records for `key`, read or commented out as unread
/// ("# vocab-size = 300  (not read: ...)"), or "".
std::string recorded(const std::string& ini, const std::string& key) {
  std::istringstream in(ini);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# ", 0) == 0) line = line.substr(2);
    if (line.rfind(key + " = ", 0) != 0) continue;
    const std::string value = line.substr(key.size() + 3);
    return value.substr(0, value.find("  ("));
  }
  return "";
}

/// recorded(ini, key) as a size > 0; throws naming the file and the text.
int64_t recorded_size(const std::string& ini_text, const std::string& key, const fs::path& ini) {
  const std::string text = recorded(ini_text, key);
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  TORCH_CHECK_VALUE(!text.empty() && *end == '\0' && value > 0, "config.ini '", ini.string(), "' records no ", key,
                    " (> 0), found '", text, "'");
  return value;
}

}  // namespace

bool is_run_checkpoint(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::path(path) / "metadata.json", ec) ||
         !latest_checkpoint((fs::path(path) / "checkpoints").string()).empty();
}

RunCheckpoint run_checkpoint(const std::string& path, const std::string& config, const StrategyRegistry& strategies,
                             const ModelRegistry& models) {
  RunCheckpoint run;
  run.checkpoint = checkpoint_of(path);
  TORCH_CHECK_VALUE(fs::exists(run.checkpoint), "checkpoint '", run.checkpoint, "' does not exist");
  run.ini = (config.empty() ? config_beside(run.checkpoint) : fs::path(config)).string();
  std::ifstream in(run.ini);
  TORCH_CHECK_VALUE(in.good(), "no config.ini at '", run.ini,
                    "' (strata-gpt writes one into its output directory); name the run's with --config INI");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto parsed = parse_run_config({"strata-export", "--config", run.ini}, cli_keys(models), strategies);
  TORCH_CHECK_VALUE(parsed.config.has_value(), parsed.message);
  run.config = *parsed.config;
  // The run records the vocabulary and sequence length the data gave the
  // model, read or not (commented out when the data has its own).
  run.vocab_size = recorded_size(text, "vocab-size", run.ini);
  run.block_size = recorded_size(text, "block-size", run.ini);
  run.model = models.resolve(model_request(run.config, run.vocab_size, run.block_size));
  return run;
}

NamedTensors run_checkpoint_tensors(const RunCheckpoint& run) {
  NamedTensors tensors;
  for (auto& [name, tensor] : read_checkpoint_tensors(run.checkpoint, "model/")) tensors[name] = tensor;
  TORCH_CHECK_VALUE(!tensors.empty(), "checkpoint '", run.checkpoint, "' holds no model tensors");
  // config.ini and the checkpoint must describe one model.
  const auto module = run.model->build(/*deferred=*/true);  // names and shapes, no memory
  std::set<std::string> names;
  for (const auto& item : module->module().named_parameters()) {
    names.insert(item.key());
    const auto it = tensors.find(item.key());
    TORCH_CHECK_VALUE(it != tensors.end() && it->second.sizes() == item.value().sizes(), "checkpoint '",
                      run.checkpoint, "' does not hold the model '", run.ini, "' describes: its ", item.key(), " ",
                      it == tensors.end() ? std::string("is missing") : c10::str("has shape ", it->second.sizes()),
                      ", the model's is ", item.value().sizes());
  }
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(names.count(name), "checkpoint '", run.checkpoint, "' holds ", name, ", which the model '",
                      run.ini, "' describes has not");
  }
  return tensors;
}

}  // namespace strata::recipes
