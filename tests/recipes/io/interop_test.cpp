// interop_test - recipes/io/interop: nanoGPT names and the weights file, without
// Python (tests/recipes/io/interop_e2e_test.cpp checks the files against Python).
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/gpt/interop.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>

namespace {
namespace fs = std::filesystem;
using namespace strata::recipes;

GPTOptions options(bool tied) { return GPTOptions(2, 2, 8).vocab_size(11).block_size(5).tie_weights(tied); }

TEST(InteropNamesTest, EveryGPTParameterMapsToNanoGPTAndBack) {
  for (bool tied : {true, false}) {
    GPTModule module(options(tied));
    std::set<std::string> theirs;
    for (const auto& item : module.module().named_parameters()) {
      const std::string name = to_nanogpt_name(item.key());
      EXPECT_EQ(from_nanogpt_name(name), item.key());
      theirs.insert(name);
    }
    EXPECT_TRUE(theirs.count("transformer.h.1.mlp.c_fc.weight"));
    EXPECT_TRUE(theirs.count("transformer.h.0.attn.c_attn.bias"));
    EXPECT_TRUE(theirs.count("transformer.ln_f.weight"));
    EXPECT_EQ(theirs.count("lm_head.weight"), tied ? 0u : 1u);
  }
  EXPECT_EQ(from_nanogpt_name("transformer.h.0.attn.bias"), "");  // nanoGPT's mask buffer
  EXPECT_EQ(from_nanogpt_name("transformer.h.x.ln_1.weight"), "");
  EXPECT_THROW(to_nanogpt_name("h0.foo.weight"), c10::ValueError);
}

TEST(InteropNamesTest, WeightsFileRoundTripsWithTiedHead) {
  const GPTOptions o = options(true);
  GPTModule source(o);
  const fs::path path = fs::temp_directory_path() / ("strata-interop-unit-" + std::to_string(::getpid()) + ".pt");
  write_weights(path.string(), named_parameters_of(source.module()), o);
  const NamedTensors file = read_weights(path.string());
  fs::remove(path);
  ASSERT_TRUE(file.count("lm_head.weight"));
  EXPECT_TRUE(file.at("lm_head.weight").equal(file.at("transformer.wte.weight")));

  torch::manual_seed(99);  // a different initialisation
  GPTModule target(o, /*deferred=*/true);
  const NamedTensors loaded = from_nanogpt(file, target.module(), o, path.string());
  const auto params = named_parameters_of(source.module());
  ASSERT_EQ(loaded.size(), params.size());
  for (const auto& [name, p] : params) EXPECT_TRUE(loaded.at(name).equal(p)) << name;
}

TEST(InteropNamesTest, TiedHeadThatDiffersIsAnError) {
  const GPTOptions o = options(true);
  GPTModule module(o);
  auto file = to_nanogpt(named_parameters_of(module.module()), o);
  file["lm_head.weight"] = file["lm_head.weight"] + 1;
  try {
    from_nanogpt(file, module.module(), o, "f.pt");
    FAIL() << "expected an error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("lm_head.weight differs"), std::string::npos);
  }
}

}  // namespace
