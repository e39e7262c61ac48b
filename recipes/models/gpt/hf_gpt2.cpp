#include "strata/recipes/models/gpt/hf_gpt2.h"

#include "strata/core/atomic_file.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/io/safetensors.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::recipes {

namespace fs = std::filesystem;

namespace {

/// transformers' Conv1D weights: [in, out], the transpose of a Linear's.
bool is_conv1d_weight(const std::string& nanogpt_name) {
  for (const char* layer : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (nanogpt_name.ends_with(layer)) return true;
  }
  return false;
}

std::string model_file(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) ? (fs::path(path) / "model.safetensors").string() : path;
}

nlohmann::json config_json(const GPTOptions& o) {
  nlohmann::ordered_json c;
  c["architectures"] = {"GPT2LMHeadModel"};
  c["model_type"] = "gpt2";
  c["vocab_size"] = o.vocab_size();
  c["n_positions"] = o.block_size();
  c["n_embd"] = o.n_embd();
  c["n_layer"] = o.n_layer();
  c["n_head"] = o.n_head();
  c["n_inner"] = nullptr;  // 4 * n_embd
  c["activation_function"] = o.activation();  // "gelu" (exact) or "gelu_new" (tanh): transformers' names
  c["layer_norm_epsilon"] = 1e-5;
  c["resid_pdrop"] = o.dropout();
  c["embd_pdrop"] = o.dropout();
  c["attn_pdrop"] = o.dropout();
  c["scale_attn_weights"] = true;
  c["tie_word_embeddings"] = o.tie_weights();
  c["bos_token_id"] = nullptr;
  c["eos_token_id"] = nullptr;
  c["dtype"] = "float32";
  return c;
}

}  // namespace

bool is_hf_gpt2(const std::string& path) {
  std::error_code ec;  // unreadable paths are not this format; read_weights then says why
  return (fs::is_directory(path, ec) && fs::exists(fs::path(path) / "model.safetensors", ec)) ||
         (fs::is_regular_file(path, ec) && path.ends_with(".safetensors"));
}

void write_hf_gpt2(const std::string& dir, const std::map<std::string, torch::Tensor>& by_strata_name,
                   const GPTOptions& options) {
  TORCH_CHECK_VALUE(options.bias(), "a Hugging Face GPT-2 has Linear and LayerNorm biases; this GPT was built "
                                    "with --bias false");
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : to_nanogpt(by_strata_name, options)) {
    if (options.tie_weights() && name == "lm_head.weight") continue;  // tied: transformers stores wte alone
    out[name] = is_conv1d_weight(name) ? tensor.t().contiguous() : tensor;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK_VALUE(fs::is_directory(dir, ec), "cannot create directory '", dir, "'", ec ? ": " + ec.message() : "");
  write_safetensors((fs::path(dir) / "model.safetensors").string(), out);
  write_file_atomically((fs::path(dir) / "config.json").string(), config_json(options).dump(2) + "\n");
}

std::map<std::string, torch::Tensor> read_hf_gpt2(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [stored, tensor] : read_safetensors(model_file(path))) {
    // transformers' own checkpoints may hold the attention mask buffers
    // (attn.bias, attn.masked_bias): not parameters, as nanoGPT skips them.
    if (stored.ends_with(".attn.bias") || stored.ends_with(".attn.masked_bias")) continue;
    // A GPT2Model (the hub's "gpt2" files) names its tensors without the
    // LM head model's "transformer." prefix.
    const bool bare = stored.rfind("transformer.", 0) != 0 && stored.rfind("lm_head.", 0) != 0;
    const std::string name = bare ? "transformer." + stored : stored;
    out[name] = is_conv1d_weight(name) ? tensor.t().contiguous() : tensor;
  }
  return out;
}

std::string hf_config_mismatch(const std::string& path, const GPTOptions& o) {
  const fs::path file = fs::path(path) / "config.json";
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::exists(file, ec)) return "";
  std::ifstream in(file);
  const auto c = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object()) return file.string() + " is not a JSON object";
  std::ostringstream diff;
  auto check = [&](const char* key, int64_t want) {
    if (!c.contains(key) || !c[key].is_number_integer()) return;
    const int64_t got = c[key].get<int64_t>();
    if (got != want) diff << (diff.tellp() > 0 ? "; " : "") << key << " " << got << " vs the model's " << want;
  };
  check("n_layer", o.n_layer());
  check("n_head", o.n_head());
  check("n_embd", o.n_embd());
  check("vocab_size", o.vocab_size());
  check("n_positions", o.block_size());
  if (c.contains("activation_function") && c["activation_function"].is_string()) {
    // transformers' gelu_pytorch_tanh is the same tanh approximation as gelu_new.
    std::string act = c["activation_function"].get<std::string>();
    if (act == "gelu_pytorch_tanh") act = "gelu_new";
    if (act != o.activation()) {
      diff << (diff.tellp() > 0 ? "; " : "") << "activation_function " << act << " vs the model's " << o.activation()
           << (act == "gelu" || act == "gelu_new" ? " (give --activation " + act + ")" : " (strata has gelu, gelu_new)");
    }
  }
  return diff.str();
}

}  // namespace strata::recipes
