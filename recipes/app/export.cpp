#include "strata/recipes/app/export.h"

#include "strata/recipes/app/run_checks.h"
#include "strata/recipes/config/cli.h"
#include "strata/callbacks/model_checkpoint.h"
#include "strata/trainer/checkpoint.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace strata::recipes {
namespace {
namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: strata-export [--format F] [--config INI] CHECKPOINT OUT\n"
    "  CHECKPOINT    a checkpoint directory (step-<N>), or an output directory (its newest\n"
    "                checkpoints/step-<N>)\n"
    "  OUT           the file or directory to write\n"
    "  --format F    one of the model family's formats (default: its first): gpt: pt (nanoGPT's\n"
    "                names, torch.load(OUT)) or hf (a transformers GPT2LMHeadModel directory);\n"
    "                llama: hf (a transformers directory: AutoModelForCausalLM.from_pretrained(OUT));\n"
    "                safetensors is hf's former name\n"
    "  --config INI  the run's config.ini (default: the one beside CHECKPOINT's checkpoints/)";

struct ExportArgs {
  std::string format;  ///< "": the family's first
  std::string config;  ///< "": beside the checkpoint
  std::string checkpoint, out;
};

/// "" or the one-line error; fills `args`.
std::string parse_args(int argc, char** argv, ExportArgs& args) {
  std::vector<std::string> positional;
  std::set<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--format" || a == "--config") {
      if (i + 1 >= argc) return a + " needs a value";
      if (!seen.insert(a).second) return a + " is given twice; give it once";
      (a == "--format" ? args.format : args.config) = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      return "unknown option '" + a + "'; allowed: --format, --config, --help";
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) {
    return "strata-export takes 2 arguments (CHECKPOINT OUT), got " + std::to_string(positional.size());
  }
  if (args.format == "safetensors") args.format = "hf";
  args.checkpoint = positional[0];
  args.out = positional[1];
  return "";
}

/// The checkpoint `path` names: itself, or an output directory's newest.
std::string checkpoint_of(const std::string& path) {
  if (fs::exists(fs::path(path) / "metadata.json")) return path;
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

/// The model the run trained, resolved from its config.ini as it was then.
ModelPtr model_of_run(const fs::path& ini, const StrategyRegistry& strategies, const ModelRegistry& models) {
  std::ifstream in(ini);
  TORCH_CHECK_VALUE(in.good(), "no config.ini at '", ini.string(),
                    "' (strata-gpt writes one into its output directory); name the run's with --config INI");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto parsed = parse_run_config({"strata-export", "--config", ini.string()}, cli_keys(models), strategies);
  TORCH_CHECK_VALUE(parsed.config.has_value(), parsed.message);
  const RunConfig& config = *parsed.config;
  // The run records the vocabulary and sequence length the data gave the
  // model, read or not (commented out when the data has its own).
  const int64_t vocab_size = recorded_size(text, "vocab-size", ini);
  const int64_t block_size = recorded_size(text, "block-size", ini);
  return models.resolve(model_request(config, vocab_size, block_size));
}

/// Throws naming the first parameter of `model` the tensors lack or hold in
/// another shape, and the first tensor it has not: config.ini and the
/// checkpoint must describe one model.
void check_matches(const ModelConfig& model, const NamedTensors& tensors, const std::string& checkpoint,
                   const fs::path& ini) {
  const auto module = model.build(/*deferred=*/true);  // names and shapes, no memory
  std::set<std::string> names;
  for (const auto& item : module->module().named_parameters()) {
    names.insert(item.key());
    const auto it = tensors.find(item.key());
    TORCH_CHECK_VALUE(it != tensors.end() && it->second.sizes() == item.value().sizes(), "checkpoint '", checkpoint,
                      "' does not hold the model '", ini.string(), "' describes: its ", item.key(), " ",
                      it == tensors.end() ? std::string("is missing") : c10::str("has shape ", it->second.sizes()),
                      ", the model's is ", item.value().sizes());
  }
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK_VALUE(names.count(name), "checkpoint '", checkpoint, "' holds ", name, ", which the model '",
                      ini.string(), "' describes has not");
  }
}

/// Phase 1: every input checked, nothing written. Fills the model and tensors.
void check_inputs(const ExportArgs& args, const StrategyRegistry& strategies, const ModelRegistry& models,
                  const std::string& checkpoint, ModelPtr& model, NamedTensors& tensors, std::string& format) {
  TORCH_CHECK_VALUE(fs::exists(checkpoint), "checkpoint '", checkpoint, "' does not exist");
  fs::path target = fs::absolute(args.out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "hf/": a directory to create
  TORCH_CHECK_VALUE(fs::is_directory(target.parent_path()), "cannot write '", args.out, "': directory '",
                    target.parent_path().string(), "' does not exist");
  const fs::path ini = args.config.empty() ? config_beside(checkpoint) : fs::path(args.config);
  model = model_of_run(ini, strategies, models);
  const auto formats = model->weight_formats();
  TORCH_CHECK_VALUE(!formats.empty(), model->export_problem(args.out, args.format));
  format = args.format.empty() ? formats.front() : args.format;
  TORCH_CHECK_VALUE(std::find(formats.begin(), formats.end(), format) != formats.end(), "unknown --format '",
                    args.format, "' for a ", model->family(), " model; allowed: ", c10::Join(", ", formats));
  const std::string problem = model->export_problem(args.out, format);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  for (auto& [name, tensor] : read_checkpoint_tensors(checkpoint, "model/")) tensors[name] = tensor;
  TORCH_CHECK_VALUE(!tensors.empty(), "checkpoint '", checkpoint, "' holds no model tensors");
  check_matches(*model, tensors, checkpoint, ini);
}

/// Runs `step`: 0, or `code` after printing what it threw as one line.
template <class Step>
int one_line_errors(int code, Step&& step) {
  try {
    step();
    return 0;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
  } catch (const std::exception& e) {  // std::filesystem errors (permissions)
    std::cerr << "error: " << e.what() << std::endl;
  }
  return code;
}

}  // namespace

int run_export(int argc, char** argv) {
  StrategyRegistry strategies;
  register_builtin_strategies(strategies);
  ModelRegistry models;
  register_builtin_models(models);
  return run_export(argc, argv, strategies, models);
}

int run_export(int argc, char** argv, const StrategyRegistry& strategies, const ModelRegistry& models) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << kUsage << std::endl;
    return 0;
  }
  ExportArgs args;
  if (const std::string error = parse_args(argc, argv, args); !error.empty()) {
    std::cerr << "error: " << error << "\n" << kUsage << std::endl;
    return 2;
  }
  const std::string checkpoint = checkpoint_of(args.checkpoint);
  ModelPtr model;
  NamedTensors tensors;
  std::string format;
  // Exit 2 for what the user gave, 1 for a write that failed.
  if (const int rc = one_line_errors(2, [&] { check_inputs(args, strategies, models, checkpoint, model, tensors, format); })) {
    return rc;
  }
  if (const int rc = one_line_errors(1, [&] { model->write_weights(args.out, tensors, format); })) return rc;
  std::cout << "strata-export: the " << model->family() << " model of '" << checkpoint << "' (" << tensors.size()
            << " tensors) written to " << args.out << " as " << format << std::endl;
  return 0;
}

}  // namespace strata::recipes
