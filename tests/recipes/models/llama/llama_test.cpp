// llama_test - the Llama family's options, presets, config.json and
// directories (recipes/models/llama, recipes/models/llama/hf_checkpoint.h), in process.
// The numbers against transformers are llama_hf_test's.
#include "tests/error_text.h"
#include "tests/temp_dir.h"
#include "strata/core/deferred_init.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/llama/hf_config.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include <fstream>

namespace {
namespace fs = std::filesystem;
using namespace strata::recipes;

using strata::testing::what_of;

// Published parameter counts: Llama 3.2 1B 1,235,814,400; Llama 3.1 8B
// 8,030,261,248; Qwen3-0.6B 596,049,920 (their model cards and
// safetensors indexes).
TEST(LlamaTest, PresetsCountThePublishedParameters) {
  EXPECT_EQ(count_parameters(llama_preset("llama-3.2-1b")), 1235814400);
  EXPECT_EQ(count_parameters(llama_preset("llama-3.1-8b")), 8030261248);
  EXPECT_EQ(count_parameters(llama_preset("qwen3-0.6b")), 596049920);
  for (const auto& name : llama_preset_names()) EXPECT_NO_THROW(validate(llama_preset(name))) << name;
  EXPECT_NE(what_of([] { llama_preset("llama-4"); }).find("available: llama-nano"), std::string::npos);
}

TEST(LlamaTest, CountMatchesTheBuiltModelWithEveryOptionalPart) {
  for (bool extras : {false, true}) {
    auto o = llama_preset("llama-nano").vocab_size(40).block_size(16).qkv_bias(extras).o_bias(extras)
                 .mlp_bias(extras).qk_norm(extras).tie_weights(extras).head_dim(extras ? 10 : 0);
    LlamaModule m(o);
    int64_t numel = 0;
    for (const auto& p : m.module().parameters()) numel += p.numel();
    EXPECT_EQ(count_parameters(o), numel) << "extras " << extras;
  }
}

TEST(LlamaTest, DeferredBuildMaterialisesToTheEagerValues) {
  auto o = llama_preset("llama-nano").vocab_size(40).block_size(16).qk_norm(true).qkv_bias(true);
  torch::manual_seed(7);
  LlamaModule eager(o);
  torch::manual_seed(7);
  LlamaModule deferred(o, /*deferred=*/true);
  ASSERT_TRUE(deferred.has_deferred_parameters());
  strata::materialize_parameters(deferred, torch::kCPU);
  auto want = eager.module().named_parameters();
  for (const auto& item : deferred.module().named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), want[item.key()])) << item.key();
  }
  auto ids = torch::randint(0, 40, {2, 16});
  EXPECT_TRUE(torch::allclose(eager.model()->forward(ids), deferred.model()->forward(ids)));
}

TEST(LlamaTest, FusedAttentionEqualsSdpaAndNaiveWithGroupedQueries) {
  // 3 query heads over 1 kv head and 4 over 2 (strata's kernel reads each kv
  // head for its group, SDPA one longer sequence under a mask), and 4 over 4:
  // the same logits and parameter gradients.
  for (const auto& [heads, kv] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {4, 2}, {4, 4}}) {
    std::map<std::string, std::pair<torch::Tensor, std::vector<torch::Tensor>>> runs;
    for (const std::string attention : {"naive", "sdpa", "fused"}) {
      torch::manual_seed(3);
      LlamaModule m(LlamaOptions(2, heads, 48, 96).n_kv_head(kv).vocab_size(40).block_size(33).attention(attention));
      torch::manual_seed(4);
      const auto ids = torch::randint(0, 40, {2, 33});
      const auto logits = m.model()->forward(ids);
      logits.square().mean().backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : m.module().parameters()) grads.push_back(p.grad().clone());
      runs[attention] = {logits.detach(), grads};
    }
    for (const std::string attention : {"sdpa", "fused"}) {
      const auto& [logits, grads] = runs[attention];
      const auto& [want, want_grads] = runs["naive"];
      const std::string what = attention + " " + std::to_string(heads) + "/" + std::to_string(kv);
      EXPECT_LT((logits - want).abs().max().item<double>(), 1e-5) << what;
      for (size_t i = 0; i < grads.size(); ++i) {
        const double rel = (grads[i] - want_grads[i]).abs().max().item<double>() /
                           want_grads[i].abs().max().item<double>();
        EXPECT_LT(rel, 1e-4) << what << " gradient " << i;
      }
    }
  }
}

const char* kConfigV4 = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": true,
  "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})";

const char* kConfigV5 = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96,
  "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": true,
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})";

TEST(LlamaTest, TransformersFourAndFiveSpellingsGiveTheSameModel) {
  const auto a = llama_options_from_hf_config(kConfigV4, "v4.json");
  const auto b = llama_options_from_hf_config(kConfigV5, "v5.json");
  for (const auto* o : {&a, &b}) {
    EXPECT_EQ(o->rope_scaling().type, "llama3");
    EXPECT_EQ(o->rope_scaling().factor, 8.0);
    EXPECT_EQ(o->rope_scaling().original_max_position, 16);
    EXPECT_EQ(o->rope_theta(), 500000.0);
    EXPECT_EQ(o->kv_heads(), 2);
    EXPECT_TRUE(o->tie_weights());
    EXPECT_EQ(o->block_size(), 64);
  }
  EXPECT_TRUE(torch::equal(rope_inverse_frequencies(a), rope_inverse_frequencies(b)));
  // What strata writes reads back to the same options.
  const auto c = llama_options_from_hf_config(llama_hf_config(a, "float32"), "written.json");
  EXPECT_TRUE(torch::equal(rope_inverse_frequencies(a), rope_inverse_frequencies(c)));
  EXPECT_EQ(count_parameters(a), count_parameters(c));
}

std::string with(std::string json, const std::string& from, const std::string& to) {
  const auto at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return json.replace(at, from.size(), to);
}

TEST(LlamaTest, WhatStrataDoesNotRunIsOneLineNamingKeyAndValue) {
  const std::string v4 = kConfigV4;
  auto refused = [](const std::string& json, int64_t block = 0) {
    return what_of([&] { llama_options_from_hf_config(json, "cfg.json", block); });
  };
  EXPECT_EQ(refused(with(v4, R"("model_type": "llama")", R"("model_type": "gemma2")")),
            "cfg.json: model_type \"gemma2\" is not supported; available: llama, mistral, qwen2, qwen3");
  EXPECT_EQ(refused(with(v4, R"("rope_type": "llama3")", R"("rope_type": "yarn")")),
            "cfg.json: rope_scaling.rope_type \"yarn\" is not supported; available: default, linear, llama3");
  EXPECT_EQ(refused(with(v4, R"("hidden_size": 64, )", "")),
            "cfg.json: 'hidden_size' is missing; a llama config needs it");
  EXPECT_EQ(refused(with(v4, R"("hidden_act": "silu")", R"("hidden_act": "gelu")")),
            "cfg.json: hidden_act 'gelu' is not supported; available: silu");
  EXPECT_EQ(refused(with(v4, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)")),
            "cfg.json: n_kv_head 3 does not divide n_head 4");
  const auto mistral = with(with(v4, R"("model_type": "llama")", R"("model_type": "mistral", "sliding_window": 32)"),
                            R"("rope_scaling": {"rope_type": "llama3")", R"("rope_scaling": {"rope_type": "default")");
  EXPECT_EQ(refused(mistral),
            "cfg.json: sliding_window 32 is shorter than the block size 64: strata runs full causal attention; use a "
            "block size <= 32");
  EXPECT_EQ(refused(mistral, /*block=*/32), "<no exception>");
  EXPECT_CONTAINS(refused("{"), "cfg.json: not valid JSON");
}

TEST(LlamaTest, ShardedDirectoryRoundTripsAndItsIndexStaysInside) {
  strata::testing::TempDir dir;
  const auto o = llama_options_from_hf_config(kConfigV4, "cfg.json");
  torch::manual_seed(1);
  LlamaModule m(o);
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& item : m.module().named_parameters()) tensors[item.key()] = item.value().to(torch::kBFloat16);
  write_hf_llama(dir.path().string(), tensors, o, /*max_shard_bytes=*/20000);
  ASSERT_TRUE(fs::exists(dir.path() / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    shards += entry.path().filename().string().rfind("model-0", 0) == 0 ? 1 : 0;
  }
  EXPECT_GE(shards, 2);
  EXPECT_TRUE(is_hf_llama_dir(dir.path().string()));
  const auto back = read_hf_tensors(dir.path().string());
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(back.at(name), t)) << name;
  auto loaded = load_hf_llama(dir.path().string());
  EXPECT_EQ(loaded->model()->named_parameters()["model.norm.weight"].scalar_type(), torch::kFloat32);
  // A part of a tensor, read from its bytes in the file, converted to fp32:
  // what each FSDP rank reads of its shard (odd bounds, across rows).
  const auto entries = read_hf_entries(dir.path().string());
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  const auto whole = tensors.at(name).to(torch::kFloat32).reshape({-1});
  auto part = torch::full({whole.numel() - 40}, -1.0f);
  read_safetensors_range(entries.at(name), 17, whole.numel() - 23, part);
  EXPECT_TRUE(torch::equal(part, whole.narrow(0, 17, whole.numel() - 40)));
  EXPECT_NE(what_of([&] { read_safetensors_range(entries.at(name), 0, whole.numel() + 1, part); }).find("outside"),
            std::string::npos);

  // An index that names a file outside the directory is refused by name.
  std::ifstream in(dir.path() / "model.safetensors.index.json");
  std::string index((std::istreambuf_iterator<char>(in)), {});
  const auto first = index.find("model-00001-of-");
  ASSERT_NE(first, std::string::npos) << index;
  index.replace(first, std::string("model-00001-of-00000.safetensors").size(), "../escape.safetensors");
  std::ofstream(dir.path() / "model.safetensors.index.json") << index;
  EXPECT_NE(what_of([&] { read_hf_tensors(dir.path().string()); }).find("'../escape.safetensors' is not a file name in"),
            std::string::npos);
}

}  // namespace
