// strata-export: a strata checkpoint -> the model's weights under nanoGPT's
// parameter names, as a file Python's torch.load reads into a dict (the same
// file strata-gpt --export-weights writes; recipes/interop.h).
//
//   strata-export runs/gpt/checkpoints/step-500 gpt.pt
//   strata-export runs/gpt gpt.pt          # an output directory: its newest checkpoint
//
// Any checkpoint loads: either format, written by any strategy at any world
// size. It runs in one process and reads the model's tensors only (not the
// optimizer state), every block checked against its CRC.
#include "callbacks/model_checkpoint.h"
#include "recipes/gpt.h"
#include "recipes/interop.h"
#include "trainer/checkpoint.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <iostream>
#include <string>

namespace {
namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: strata-export CHECKPOINT OUT\n"
    "  CHECKPOINT  a checkpoint directory (step-<N>), or an output directory (its newest\n"
    "              checkpoints/step-<N>)\n"
    "  OUT         the weights file to write (nanoGPT names; Python: torch.load(OUT))";

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
  if (argc != 3) {
    std::cerr << "error: strata-export takes 2 arguments, got " << argc - 1 << "\n" << kUsage << std::endl;
    return 2;
  }
  const std::string checkpoint = checkpoint_of(argv[1]);
  const std::string out = argv[2];
  strata::recipes::NamedTensors weights;
  try {
    TORCH_CHECK_VALUE(fs::exists(checkpoint), "checkpoint '", checkpoint, "' does not exist");
    const auto parent = fs::absolute(out).parent_path();
    TORCH_CHECK_VALUE(fs::is_directory(parent), "cannot write '", out, "': directory '", parent.string(),
                      "' does not exist");
    for (auto& [name, tensor] : strata::read_checkpoint_tensors(checkpoint, "model/")) weights[name] = tensor;
    TORCH_CHECK_VALUE(!weights.empty(), "checkpoint '", checkpoint, "' holds no model tensors");
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  }
  try {
    // Only tie_weights is read by the name mapping: a checkpoint of a tied
    // GPT stores wte alone, and nanoGPT's file lists it under lm_head too.
    const bool tied = weights.count("lm_head.weight") == 0;
    const auto options = strata::recipes::GPTOptions(1, 1, 1).tie_weights(tied);
    strata::recipes::write_weights(out, weights, options);
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 1;
  }
  std::cout << "strata-export: " << weights.size() << " tensors of '" << checkpoint << "' written to " << out
            << std::endl;
  return 0;
}
