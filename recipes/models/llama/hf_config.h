#pragma once
// transformers' config.json for the Llama family, both ways: model_type
// llama (Llama 2 and 3.x, TinyLlama, SmolLM2), mistral, qwen2 (Qwen2 and
// 2.5) and qwen3 (dense). transformers 4.x spells RoPE as rope_theta and
// rope_scaling, 5.x as rope_parameters; both are read. A key the decoder
// needs and the file lacks is an error, except where transformers itself
// fills the gap the same way for every model of the type (num_key_value_heads
// and head_dim absent or null, mlp_bias and attention_bias absent: false,
// tie_word_embeddings absent: the class default, false). A feature strata
// does not run (another model_type, hidden_act, RoPE type, a sliding window
// or layer type, attention dropout) is one line naming the key and value.
#include "strata/recipes/models/llama/llama.h"

#include <string>
#include <vector>

namespace strata::recipes {

/// The model types read: llama, mistral, qwen2, qwen3.
std::vector<std::string> llama_model_types();

/// The options config.json's text describes; `where` names the file in
/// errors. `block_size`: the longest sequence trained on (0: the config's
/// max_position_embeddings); a sliding window shorter than it is refused.
LlamaOptions llama_options_from_hf_config(const std::string& json_text, const std::string& where,
                                          int64_t block_size = 0);

/// config.json's text for these options under their model_type, with
/// `dtype` ("float32", "bfloat16", "float16") as the weights' dtype, which
/// AutoConfig and AutoModelForCausalLM read back.
std::string llama_hf_config(const LlamaOptions& options, const std::string& dtype);

}  // namespace strata::recipes
