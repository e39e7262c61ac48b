// The Llama family's presets (llama.h): the shapes of each model's published
// config.json, and small ones for tests.
#include "strata/recipes/models/llama/llama.h"

#include <c10/util/StringUtil.h>

namespace strata::recipes {
namespace {

struct LlamaPreset {
  const char* name;
  LlamaOptions options;
};

RopeScaling llama3_scaling(double factor) {
  RopeScaling s;
  s.type = "llama3";
  s.factor = factor;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position = 8192;
  return s;
}

/// The shapes of each model's published config.json (transformers' names in
/// the comments: num_hidden_layers, num_attention_heads, hidden_size,
/// intermediate_size; num_key_value_heads, head_dim, vocab_size,
/// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling,
/// tie_word_embeddings).
const std::vector<LlamaPreset>& llama_presets() {
  auto llama3 = [](int64_t l, int64_t h, int64_t c, int64_t f, double factor, bool tied) {
    return LlamaOptions(l, h, c, f).n_kv_head(8).vocab_size(128256).max_position_embeddings(131072)
        .block_size(131072).rope_theta(500000.0).rope_scaling(llama3_scaling(factor)).tie_weights(tied);
  };
  auto qwen = [](int64_t l, int64_t h, int64_t kv, int64_t c, int64_t f, int64_t vocab, int64_t positions) {
    return LlamaOptions(l, h, c, f).n_kv_head(kv).vocab_size(vocab).max_position_embeddings(positions)
        .block_size(positions).rms_norm_eps(1e-6).rope_theta(1e6);
  };
  auto smol = [](int64_t l, int64_t h, int64_t kv, int64_t c, int64_t f, double theta) {
    return LlamaOptions(l, h, c, f).n_kv_head(kv).vocab_size(49152).max_position_embeddings(8192)
        .block_size(8192).rope_theta(theta).tie_weights(true);
  };
  auto small = [](int64_t l, int64_t h, int64_t c, int64_t f) {
    return LlamaOptions(l, h, c, f).n_kv_head(h % 2 == 0 ? 2 : 1).block_size(1024).max_position_embeddings(1024);
  };
  static const std::vector<LlamaPreset> table = {
      {"llama-nano", small(3, 3, 48, 128)},
      {"llama-micro", small(4, 4, 128, 352)},
      {"llama-mini", small(6, 6, 192, 512)},
      {"llama-2-7b", LlamaOptions(32, 32, 4096, 11008).vocab_size(32000).max_position_embeddings(4096).block_size(4096)},
      {"tinyllama-1.1b",
       LlamaOptions(22, 32, 2048, 5632).n_kv_head(4).vocab_size(32000).max_position_embeddings(2048).block_size(2048)},
      {"llama-3.2-1b", llama3(16, 32, 2048, 8192, 32.0, true)},
      {"llama-3.2-3b", llama3(28, 24, 3072, 8192, 32.0, true)},
      {"llama-3.1-8b", llama3(32, 32, 4096, 14336, 8.0, false)},
      {"llama-3.1-70b", llama3(80, 64, 8192, 28672, 8.0, false)},
      {"llama-3.1-405b", llama3(126, 128, 16384, 53248, 8.0, false)},
      {"smollm2-135m", smol(30, 9, 3, 576, 1536, 100000.0)},
      {"smollm2-360m", smol(32, 15, 5, 960, 2560, 100000.0)},
      {"smollm2-1.7b", smol(24, 32, 32, 2048, 8192, 130000.0)},
      {"mistral-7b", LlamaOptions(32, 32, 4096, 14336).n_kv_head(8).vocab_size(32768).max_position_embeddings(32768)
                         .block_size(32768).rope_theta(1e6).model_type("mistral")},
      {"qwen2.5-0.5b", qwen(24, 14, 2, 896, 4864, 151936, 32768).qkv_bias(true).tie_weights(true).model_type("qwen2")},
      {"qwen2.5-7b", qwen(28, 28, 4, 3584, 18944, 152064, 131072).qkv_bias(true).model_type("qwen2")},
      {"qwen3-0.6b",
       qwen(28, 16, 8, 1024, 3072, 151936, 40960).head_dim(128).qk_norm(true).tie_weights(true).model_type("qwen3")},
      {"qwen3-8b", qwen(36, 32, 8, 4096, 12288, 151936, 40960).head_dim(128).qk_norm(true).model_type("qwen3")},
  };
  return table;
}

}  // namespace

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : llama_presets()) names.emplace_back(p.name);
  return names;
}

LlamaOptions llama_preset(const std::string& name) {
  for (const auto& p : llama_presets()) {
    if (name == p.name) return p.options;
  }
  TORCH_CHECK_VALUE(false, "unknown preset '", name, "'; available: ", c10::Join(", ", llama_preset_names()));
}

}  // namespace strata::recipes
