// strata-fuzz: libFuzzer's entry points over one target of
// tests/fuzz/fuzz_targets.h, chosen by STRATA_FUZZ_TARGET (scripts/fuzz sets
// it). Built only with -DSTRATA_FUZZ=ON under clang (scripts/fuzz).
#include "tests/fuzz/fuzz_targets.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace {

const strata::fuzz::Target* target = nullptr;
// Why a pointer that is never deleted: libFuzzer leaves by _Exit and
// abort(), after which no destructor runs; scripts/fuzz gives each run a
// TMPDIR of its own and removes it.
strata::fuzz::Workspace* workspace = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* name = std::getenv("STRATA_FUZZ_TARGET");
  target = name ? strata::fuzz::find_target(name) : nullptr;
  if (target == nullptr) {
    std::fprintf(stderr, "error: STRATA_FUZZ_TARGET is '%s'; one of:", name ? name : "");
    for (const auto& t : strata::fuzz::targets()) std::fprintf(stderr, " %s", t.name.c_str());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  // One intra-op thread: an input's cost is the parser's, and runs repeat.
  torch::set_num_threads(1);
  workspace = new strata::fuzz::Workspace();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto outcome = target->run(std::string_view(reinterpret_cast<const char*>(data), size), *workspace);
  if (outcome.broken) {
    // abort(): libFuzzer keeps the input as crash-<sha1> and stops.
    std::fprintf(stderr, "strata-fuzz %s: the contract broke: %s\n", target->name.c_str(), outcome.broken->c_str());
    std::abort();
  }
  return 0;
}
