#pragma once
// The GPT as a Hugging Face transformers GPT2LMHeadModel directory:
// model.safetensors + config.json, which
// `transformers.GPT2LMHeadModel.from_pretrained(dir)` loads, and which
// strata-gpt --init-from reads back. Names are nanoGPT's (which are
// transformers'), and the four Conv1D weights (attn.c_attn, attn.c_proj,
// mlp.c_fc, mlp.c_proj) are stored transposed, [in, out], as Conv1D keeps
// them. config.json's activation_function is the GPT's activation: "gelu"
// (exact, strata's and nanoGPT's default) or "gelu_new" (the tanh
// approximation OpenAI's GPT-2 checkpoints use; GPTOptions::activation).
#include "strata/recipes/models/gpt/gpt.h"

#include <map>
#include <optional>
#include <string>

namespace strata::recipes {

/// True for a directory holding model.safetensors, or a *.safetensors file.
bool is_hf_gpt2(const std::string& path);

/// Writes the GPT's parameters (strata names, full values; LoRA adapters
/// already merged) as `dir`/model.safetensors and `dir`/config.json (the
/// directory is created if missing). GPT-2 has Linear and LayerNorm biases:
/// a model built without them is an error.
void write_hf_gpt2(const std::string& dir, const std::map<std::string, torch::Tensor>& by_strata_name,
                   const GPTOptions& options);

/// The tensors of an HF GPT-2 directory (or .safetensors file) under nanoGPT's
/// names in Linear layout (Conv1D weights transposed back), as read_weights()
/// gives for a torch.save file; lm_head.weight is absent when tied.
std::map<std::string, torch::Tensor> read_hf_gpt2(const std::string& path);

/// config.json's sizes and activation against `options` (n_layer, n_head,
/// n_embd, vocab_size, n_positions = block_size, activation_function): "" or
/// what differs. A directory
/// without config.json, or a bare .safetensors file, gives "".
std::string hf_config_mismatch(const std::string& path, const GPTOptions& options);

}  // namespace strata::recipes
