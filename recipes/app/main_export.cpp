// strata-export: a strata checkpoint -> the model's weights under nanoGPT's
// parameter names, as a file Python's torch.load reads into a dict (the same
// file strata-gpt --export-weights writes; recipes/models/gpt/interop.h), or as a
// Hugging Face GPT2LMHeadModel directory (model.safetensors + config.json;
// recipes/models/gpt/hf_gpt2.h).
//
//   strata-export runs/gpt/checkpoints/step-500 gpt.pt
//   strata-export runs/gpt gpt.pt          # an output directory: its newest checkpoint
//   strata-export --format safetensors runs/gpt hf-gpt2/   # transformers' from_pretrained
//
// Any checkpoint loads: either format, written by any strategy at any world
// size. It runs in one process and reads the model's tensors only (not the
// optimizer state), every block checked against its CRC.
#include "strata/callbacks/model_checkpoint.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/gpt/hf_gpt2.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/trainer/checkpoint.h"

#include <c10/util/StringUtil.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: strata-export [--format pt|safetensors] [--n-head N] CHECKPOINT OUT\n"
    "  CHECKPOINT  a checkpoint directory (step-<N>), or an output directory (its newest\n"
    "              checkpoints/step-<N>)\n"
    "  OUT         pt (default): the weights file to write (nanoGPT names; Python: torch.load(OUT));\n"
    "              safetensors: a directory for model.safetensors + config.json\n"
    "              (transformers.GPT2LMHeadModel.from_pretrained(OUT))\n"
    "  --n-head N  safetensors: the attention heads (default: n-head in the run's config.ini)";

struct ExportArgs {
  std::string format = "pt";
  int64_t n_head = 0;
  std::string checkpoint, out;
};

/// "" or the one-line error; fills `args`.
std::string parse_args(int argc, char** argv, ExportArgs& args) {
  std::vector<std::string> positional;
  std::set<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--format" || a == "--n-head") {
      if (i + 1 >= argc) return a + " needs a value";
      if (!seen.insert(a).second) return a + " is given twice; give it once";
      const std::string v = argv[++i];
      if (a == "--format") {
        if (v != "pt" && v != "safetensors") return "unknown --format '" + v + "'; allowed: pt, safetensors";
        args.format = v;
      } else {
        char* end = nullptr;
        args.n_head = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || args.n_head <= 0) return "invalid value '" + v + "' for --n-head: must be > 0";
      }
    } else if (a.rfind("--", 0) == 0) {
      return "unknown option '" + a + "'";
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) {
    return "strata-export takes 2 arguments (CHECKPOINT OUT), got " + std::to_string(positional.size());
  }
  if (args.n_head > 0 && args.format != "safetensors") return "--n-head applies only with --format safetensors";
  args.checkpoint = positional[0];
  args.out = positional[1];
  return "";
}

/// `key`'s value in the run's config.ini (<output dir>/config.ini beside
/// checkpoints/step-N), or "".
std::string run_setting(const std::string& checkpoint, const std::string& key) {
  fs::path dir = fs::absolute(checkpoint).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "…/step-4/"
  const fs::path ini = dir.parent_path().parent_path() / "config.ini";
  std::ifstream in(ini);
  const std::string prefix = key + " = ";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

/// LoRA's rank and alpha, when the checkpoint holds adapters: from the
/// run's config.ini (merging needs alpha / rank).
void lora_of_run(const strata::recipes::NamedTensors& w, const std::string& checkpoint,
                 strata::recipes::GPTOptions& options) {
  bool adapters = false;
  for (const auto& [name, t] : w) adapters = adapters || strata::recipes::is_lora_parameter(name);
  if (!adapters) return;
  // The rank is A's first dimension; alpha is not in the tensors.
  int64_t rank = 0;
  for (const auto& [name, t] : w) {
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "_lora.A") == 0) rank = t.size(0);
  }
  const std::string alpha_text = run_setting(checkpoint, "lora-alpha");
  char* end = nullptr;
  const double alpha = std::strtod(alpha_text.c_str(), &end);
  TORCH_CHECK_VALUE(!alpha_text.empty() && *end == '\0' && alpha > 0, "checkpoint '", checkpoint,
                    "' holds LoRA adapters, but no config.ini beside its run gives a lora-alpha (> 0) to merge them "
                    "with (found '", alpha_text, "')");
  options.lora_rank(rank).lora_alpha(alpha);
}

/// The GPT's options as far as the tensors and the head count tell them.
strata::recipes::GPTOptions options_of(const strata::recipes::NamedTensors& w, int64_t n_head) {
  int64_t layers = 0;
  while (w.count(c10::str("h", layers, ".ln_1.weight"))) ++layers;
  const auto& wte = w.at("wte.weight");
  return strata::recipes::GPTOptions(layers, n_head, wte.size(1))
      .vocab_size(wte.size(0))
      .block_size(w.at("wpe.weight").size(0))
      .bias(w.count("h0.attn.c_attn.bias") == 1)
      .tie_weights(w.count("lm_head.weight") == 0)
      .dropout(0.0);
}

/// The checkpoint `path` names: itself, or an output directory's newest.
std::string checkpoint_of(const std::string& path) {
  if (fs::exists(fs::path(path) / "metadata.json")) return path;
  const auto newest = strata::latest_checkpoint((fs::path(path) / "checkpoints").string());
  if (!newest.empty()) return newest;
  return path;  // read_checkpoint_tensors says why it is not a checkpoint
}
}  // namespace

int main(int argc, char** argv) {
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
  const std::string& out = args.out;
  strata::recipes::NamedTensors weights;
  strata::recipes::GPTOptions options(1, 1, 1);
  try {
    TORCH_CHECK_VALUE(fs::exists(checkpoint), "checkpoint '", checkpoint, "' does not exist");
    fs::path target = fs::absolute(out).lexically_normal();
    if (target.filename().empty()) target = target.parent_path();  // "hf-gpt2/": a directory to create
    const auto parent = target.parent_path();
    TORCH_CHECK_VALUE(fs::is_directory(parent), "cannot write '", out, "': directory '", parent.string(),
                      "' does not exist");
    for (auto& [name, tensor] : strata::read_checkpoint_tensors(checkpoint, "model/")) weights[name] = tensor;
    TORCH_CHECK_VALUE(!weights.empty(), "checkpoint '", checkpoint, "' holds no model tensors");
    // LoRA adapters are merged into their Linears: the file is a plain GPT.
    const int64_t n_head = args.n_head > 0 ? args.n_head : std::strtoll(run_setting(checkpoint, "n-head").c_str(), nullptr, 10);
    if (args.format == "safetensors") {
      TORCH_CHECK_VALUE(n_head > 0, "--format safetensors needs the head count: no config.ini beside '", checkpoint,
                        "'s run; give --n-head N");
      TORCH_CHECK_VALUE(weights.count("wte.weight") && weights.count("wpe.weight"), "checkpoint '", checkpoint,
                        "' holds no GPT (wte.weight, wpe.weight)");
      options = options_of(weights, n_head);
      const std::string activation = run_setting(checkpoint, "activation");
      options.activation(activation.empty() ? "gelu" : activation);  // runs before the option existed: gelu
      strata::recipes::validate(options);
      TORCH_CHECK_VALUE(options.n_embd() % n_head == 0, "--n-head ", n_head, " does not divide n_embd ", options.n_embd());
      TORCH_CHECK_VALUE(options.bias(), "a Hugging Face GPT-2 has Linear and LayerNorm biases; checkpoint '", checkpoint,
                        "' is of a GPT built with --bias false");
    }
    // Only tie_weights is read by the pt name mapping: a checkpoint of a tied
    // GPT stores wte alone, and nanoGPT's file lists it under lm_head too.
    options.tie_weights(weights.count("lm_head.weight") == 0);
    lora_of_run(weights, checkpoint, options);
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const std::exception& e) {  // std::filesystem errors (permissions)
    std::cerr << "error: " << e.what() << std::endl;
    return 2;
  }
  try {
    if (args.format == "safetensors") {
      strata::recipes::write_hf_gpt2(out, strata::recipes::merge_lora(weights, options), options);
    } else {
      strata::recipes::write_weights(out, strata::recipes::merge_lora(weights, options), options);
    }
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  std::cout << "strata-export: " << weights.size() << " tensors of '" << checkpoint << "' written to " << out
            << std::endl;
  return 0;
}
