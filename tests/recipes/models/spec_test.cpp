// spec_test - the model registry and the built-in families' ModelConfigs
// (recipes/models/spec.h): what the planner, the checks, the dry run and the
// GEMM ceiling read, checked against the models they build.
#include "tests/error_text.h"
#include "tests/temp_dir.h"
#include "strata/recipes/models/gpt/spec.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/llama/spec.h"
#include "strata/recipes/models/spec.h"

#include <gtest/gtest.h>

#include <set>

namespace {
using namespace strata::recipes;
using strata::testing::what_of;

ModelRegistry builtins() {
  ModelRegistry registry;
  register_builtin_models(registry);
  return registry;
}

ModelRequest request(const std::string& preset, std::map<std::string, std::string> options = {}) {
  ModelRequest r;
  r.preset = preset;
  r.options = std::move(options);
  r.vocab_size = 12;
  r.block_size = 11;
  return r;
}

/// Elements of every distinct parameter tensor (a tied head counts once).
int64_t numel_of(torch::nn::Module& module) {
  int64_t n = 0;
  std::set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

TEST(ModelSpecTest, EachPresetResolvesToItsFamilyWithTheDatasSizes) {
  const auto registry = builtins();
  const auto gpt = registry.resolve(request("gpt-micro", {{"n-layer", "2"}, {"dropout", "0.1"}}));
  EXPECT_EQ(gpt->family(), "gpt");
  EXPECT_EQ(gpt->shape().layers, 2);
  EXPECT_EQ(gpt->shape().vocab_size, 12);
  EXPECT_EQ(gpt->shape().block_size, 11);
  EXPECT_DOUBLE_EQ(gpt->resolved_numbers().at("dropout"), 0.1);
  const auto llama = registry.resolve(request("llama-micro", {{"attention", "naive"}}));
  EXPECT_EQ(llama->family(), "llama");
  EXPECT_EQ(llama->shape().kv_heads, 2);
  EXPECT_EQ(dynamic_cast<const LlamaConfig&>(*llama).options().attention(), "naive");
  const auto names = registry.preset_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen3-0.6b"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "gpt2"), names.end());
}

TEST(ModelSpecTest, WhatAFamilyDoesNotReadIsRefusedNamingKeyAndFamily) {
  const auto registry = builtins();
  EXPECT_EQ(what_of([&] { registry.resolve(request("llama-micro", {{"bias", "false"}})); }),
            "--bias false does not apply to the llama family (--preset llama-micro); its options: --n-layer, "
            "--n-head, --n-embd, --attention, --lora-rank, --lora-alpha, --lora-targets");
  EXPECT_NE(what_of([&] { registry.resolve(request("gpt-5")); }).find("unknown preset 'gpt-5'; available: gpt-nano"),
            std::string::npos);
  EXPECT_EQ(what_of([&] { registry.resolve(request("gpt-micro", {{"n-layer", "two"}})); }),
            "invalid value 'two' for --n-layer: expected an integer (the gpt family)");
  // The family's declared rule.
  EXPECT_EQ(what_of([&] { registry.resolve(request("llama-micro", {{"attention", "flash"}})); }),
            "invalid value 'flash' for --attention: one of fused, sdpa, naive (the llama family)");
  EXPECT_EQ(what_of([&] { registry.resolve(request("gpt-micro", {{"dropout", "1"}})); }),
            "invalid value '1' for --dropout: must be in [-1, 1) (the gpt family)");
  // LoRA's targets are the family's own names.
  EXPECT_EQ(what_of([&] { registry.resolve(request("gpt-micro", {{"lora-rank", "4"}, {"lora-targets", "q,v"}})); }),
            "unknown LoRA targets 'q,v'; allowed: attn, mlp, attn,mlp");
  EXPECT_EQ(what_of([&] { registry.resolve(request("llama-micro", {{"lora-rank", "4"}, {"lora-targets", "attn"}})); }),
            "unknown LoRA target 'attn' in 'attn'; allowed: q, k, v, o, gate, up, down (or q_proj, ..., down_proj), "
            "comma-separated, or all");
  ModelRegistry twice = builtins();
  EXPECT_NE(what_of([&] { twice.add(gpt_model_spec()); }).find("'gpt' is already registered"), std::string::npos);
  ModelSpec clash("mine", "a user's family");
  clash.presets({"gpt-micro"}).factory([](const ModelRequest&) -> ModelPtr { return nullptr; });
  EXPECT_NE(what_of([&] { twice.add(clash); }).find("preset 'gpt-micro' of model family 'mine'"), std::string::npos);
}

TEST(ModelSpecTest, BenchWorkloadsNameTheFamilysOwnPresetsAndTheFirstFamilyGivingThemRunsTheSuites) {
  EXPECT_EQ(builtins().bench_family().name(), "gpt");
  ModelRegistry llama_only;
  EXPECT_NE(what_of([&] { llama_only.bench_family(); }).find("no registered model family gives bench workloads"),
            std::string::npos);
  ModelSpec llama = llama_model_spec();
  BenchWorkloads bench = llama.bench();
  bench.medium = {"gpt-mini"};
  EXPECT_EQ(what_of([&] { llama_only.add(ModelSpec(llama).bench(bench)); }),
            "model family 'llama': bench preset 'gpt-mini' is not one of its presets");
  bench.medium = {"llama-mini", 8, 40};
  llama_only.add(llama.bench(bench));
  EXPECT_EQ(llama_only.bench_family().bench().medium.preset, "llama-mini");
}

TEST(ModelSpecTest, GptCountsFlopsAndGemmsAgreeWithTheBuiltModel) {
  for (const auto& options : {gpt_preset("gpt-micro").vocab_size(12).block_size(11),
                              gpt_preset("gpt-nano").vocab_size(12).block_size(11).lora_rank(2).bias(false)}) {
    const auto model = gpt_model(options);
    const auto built = model->build(/*deferred=*/false);
    EXPECT_EQ(model->parameters(), numel_of(built->module()));
    EXPECT_DOUBLE_EQ(model->flops_per_token(), built->flops_per_token());
    const strata::ModelSize size = model->size();
    const auto units = built->wrap_units();
    ASSERT_EQ(size.units, static_cast<int64_t>(units.size()));
    EXPECT_EQ(size.unit_params, numel_of(*units.front()));
    EXPECT_EQ(size.root_params(), model->parameters() - size.units * numel_of(*units.front()));
  }
  const auto model = gpt_model(gpt_preset("gpt-micro").vocab_size(12).block_size(11));
  EXPECT_EQ(model->tensor_parallel_problem(3, false),
            "tensor-parallel size 3 must divide n_head 4: each rank computes whole heads");
  EXPECT_EQ(model->tensor_parallel_problem(2, false), "");
  EXPECT_NE(model->tensor_parallel_problem(2, true).find("block size 11"), std::string::npos);
}

TEST(ModelSpecTest, LlamaCountsFlopsAndGemmsAgreeWithTheBuiltModel) {
  for (bool extras : {false, true}) {
    const auto options = llama_preset("llama-micro").vocab_size(12).block_size(11).qkv_bias(extras).qk_norm(extras)
                             .tie_weights(extras);
    const auto model = llama_model(options);
    const auto built = model->build(/*deferred=*/false);
    EXPECT_EQ(model->parameters(), numel_of(built->module()));
    EXPECT_DOUBLE_EQ(model->flops_per_token(), built->flops_per_token());
    const auto units = built->wrap_units();
    EXPECT_EQ(model->size().unit_params, numel_of(*units.front()));
    // 6 FLOPs per weight of every Linear and token (the head's included).
    const int64_t tokens = 4 * 11;
    double flops = 0.0;
    for (const auto& s : model->step_gemms(tokens)) flops += s.flops();
    int64_t linear = 0;
    for (const auto& item : built->module().named_parameters()) {
      const bool matrix = item.value().dim() == 2 && item.key().find("embed_tokens") == std::string::npos;
      if (matrix) linear += item.value().numel();
    }
    if (options.tie_weights()) linear += 12 * options.n_embd();  // the tied head multiplies too
    EXPECT_DOUBLE_EQ(flops, 6.0 * double(linear) * double(tokens)) << "extras " << extras;
  }
}

TEST(ModelSpecTest, GptInitStdFollowsTheWidth) {
  EXPECT_DOUBLE_EQ(gpt_init_std(768), 0.02);
  EXPECT_DOUBLE_EQ(gpt_init_std(1600), 0.02);
  EXPECT_NEAR(gpt_init_std(128), 0.02 * std::sqrt(6.0), 1e-12);
  for (double std_given : {0.0, 0.02}) {
    torch::manual_seed(3);
    const auto options = gpt_preset("gpt-micro").vocab_size(512).block_size(16).init_std(std_given);
    GPTModule module(options);
    const auto w = module.module().named_parameters()["h0.c_fc.weight"];
    const double want = std_given > 0 ? std_given : gpt_init_std(128);
    EXPECT_NEAR(w.std().item<double>(), want, 0.03 * want) << "init_std " << std_given;
  }
  EXPECT_NE(what_of([] { validate(gpt_preset("gpt-micro").init_std(-0.1)); }).find("init_std must be in [0, 1)"),
            std::string::npos);
}

TEST(ModelSpecTest, ATransformersDirectoryGivesTheLlamaModelWithoutAPreset) {
  strata::testing::TempDir dir;
  const auto options = llama_preset("llama-nano").vocab_size(40).block_size(32).max_position_embeddings(32);
  torch::manual_seed(5);
  LlamaModule source(options);
  NamedTensors tensors;
  for (const auto& item : source.module().named_parameters()) tensors[item.key()] = item.value();
  write_hf_llama(dir.path().string(), tensors, options);
  const auto registry = builtins();
  ModelRequest r = request("");
  r.init_from = dir.path().string();
  const auto model = registry.resolve(r);
  EXPECT_EQ(model->family(), "llama");
  EXPECT_EQ(model->shape().vocab_size, 40) << "the checkpoint's vocabulary, not the data's 12";
  EXPECT_EQ(model->shape().block_size, 11) << "the data's block size";
  const auto weights = model->read_weights(r.init_from);
  EXPECT_TRUE(weights->serves_parts()) << "read in parts, as each FSDP rank reads its shards";
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(weights->has(name)) << name;
    auto flat = torch::empty({t.numel()});
    weights->read(name, 0, t.numel(), flat);
    EXPECT_TRUE(torch::equal(flat.view(t.sizes()), t)) << name;
  }
  r.preset = "llama-nano";
  EXPECT_NE(what_of([&] { registry.resolve(r); }).find("both give the model; drop --preset"), std::string::npos);
  r.preset = "";
  r.options = {{"n-layer", "1"}};
  EXPECT_NE(what_of([&] { registry.resolve(r); }).find("--n-layer 1 does not apply with --init-from"),
            std::string::npos);
  r.options = {};
  r.vocab_size = 41;
  EXPECT_NE(what_of([&] { registry.resolve(r); }).find("vocabulary of 40 tokens is smaller than the data's 41"),
            std::string::npos);
  // A model whose shapes differ from the directory's is refused naming the tensor.
  const auto other = llama_model(llama_preset("llama-nano").vocab_size(40).block_size(11).n_layer(2).n_embd(96).n_head(3).n_kv_head(3));
  EXPECT_NE(what_of([&] { other->read_weights(dir.path().string()); }).find("has shape"), std::string::npos);
}

}  // namespace
