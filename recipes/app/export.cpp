#include "strata/recipes/app/export.h"

#include "strata/recipes/app/run_checkpoint.h"
#include "strata/recipes/config/cli.h"

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

/// Phase 1: every input checked, nothing written. Fills the model and tensors.
void check_inputs(const ExportArgs& args, const StrategyRegistry& strategies, const ModelRegistry& models,
                  RunCheckpoint& run, NamedTensors& tensors, std::string& format) {
  TORCH_CHECK_VALUE(fs::exists(args.checkpoint), "checkpoint '", args.checkpoint, "' does not exist");
  fs::path target = fs::absolute(args.out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "hf/": a directory to create
  TORCH_CHECK_VALUE(fs::is_directory(target.parent_path()), "cannot write '", args.out, "': directory '",
                    target.parent_path().string(), "' does not exist");
  run = run_checkpoint(args.checkpoint, args.config, strategies, models);
  const auto formats = run.model->weight_formats();
  TORCH_CHECK_VALUE(!formats.empty(), run.model->export_problem(args.out, args.format));
  format = args.format.empty() ? formats.front() : args.format;
  TORCH_CHECK_VALUE(std::find(formats.begin(), formats.end(), format) != formats.end(), "unknown --format '",
                    args.format, "' for a ", run.model->family(), " model; allowed: ", c10::Join(", ", formats));
  const std::string problem = run.model->export_problem(args.out, format);
  TORCH_CHECK_VALUE(problem.empty(), problem);
  tensors = run_checkpoint_tensors(run);
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
  RunCheckpoint run;
  NamedTensors tensors;
  std::string format;
  // Exit 2 for what the user gave, 1 for a write that failed.
  if (const int rc = one_line_errors(2, [&] { check_inputs(args, strategies, models, run, tensors, format); })) {
    return rc;
  }
  if (const int rc = one_line_errors(1, [&] { run.model->write_weights(args.out, tensors, format); })) return rc;
  std::cout << "strata-export: the " << run.model->family() << " model of '" << run.checkpoint << "' (" << tensors.size()
            << " tensors) written to " << args.out << " as " << format << std::endl;
  return 0;
}

}  // namespace strata::recipes
