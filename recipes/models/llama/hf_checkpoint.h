#pragma once
// transformers' checkpoint directories of the Llama family, in and out:
// config.json and model.safetensors, or model.safetensors.index.json (its
// weight_map names each tensor's shard) with its shards. Parameter names are
// transformers' own (recipes/models/llama), so loading is a copy by name.
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/llama/llama.h"

#include <map>
#include <memory>
#include <string>

namespace strata::recipes {

/// True for a directory whose config.json names a Llama-family model_type.
bool is_hf_llama_dir(const std::string& dir);

/// config.json's options (llama_options_from_hf_config; `block_size` 0: the
/// config's max_position_embeddings).
LlamaOptions read_hf_llama_options(const std::string& dir, int64_t block_size = 0);

/// Every tensor of the directory's safetensors, single file or sharded, by
/// name. A missing shard, a name in two shards, or an index naming a file
/// outside the directory is an error naming it.
std::map<std::string, torch::Tensor> read_hf_tensors(const std::string& dir);

/// The same tensors described, not read (their headers, checked alike):
/// where each one's bytes are, for reading its parts (read_safetensors_range).
std::map<std::string, SafetensorsEntry> read_hf_entries(const std::string& dir);

/// Copies `tensors` into `module`'s parameters by name, converting the dtype:
/// a missing or an unexpected name, or a shape that differs, is an error
/// naming it (the tied head's lm_head.weight and RoPE's stored inv_freq
/// buffers, which older checkpoints carry, are skipped).
void load_llama_weights(LlamaModule& module, const std::map<std::string, torch::Tensor>& tensors,
                        const std::string& where);

/// A LlamaModule built from the directory's config and weights (fp32
/// parameters), its block size `block_size` (0: max_position_embeddings).
std::unique_ptr<LlamaModule> load_hf_llama(const std::string& dir, int64_t block_size = 0);

/// Writes `tensors` (transformers' names) as `dir`/config.json (model_type
/// from `options`) and model.safetensors, or, above `max_shard_bytes`,
/// model-0000i-of-0000n.safetensors shards with model.safetensors.index.json
/// as transformers shards them. The dtype recorded is the tensors'.
void write_hf_llama(const std::string& dir, const std::map<std::string, torch::Tensor>& tensors,
                    const LlamaOptions& options, int64_t max_shard_bytes = int64_t{5} << 30);

}  // namespace strata::recipes
