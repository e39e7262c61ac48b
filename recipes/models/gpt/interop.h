#pragma once
// nanoGPT interop: a GPT's weights under nanoGPT's parameter names, in a file
// Python reads with `torch.load(path)` (a dict name -> tensor, the layout of
// nanoGPT's `model.state_dict()`), and back.
//
//   strata name              nanoGPT name
//   wte.weight               transformer.wte.weight
//   wpe.weight               transformer.wpe.weight
//   h3.ln_1.weight           transformer.h.3.ln_1.weight        (ln_2 likewise)
//   h3.attn.c_attn.weight    transformer.h.3.attn.c_attn.weight (attn.c_proj likewise)
//   h3.c_fc.weight           transformer.h.3.mlp.c_fc.weight    (c_proj likewise)
//   ln_f.weight              transformer.ln_f.weight
//   lm_head.weight           lm_head.weight  (tied: a copy of wte, as nanoGPT's state_dict has)
// and the same for every `.bias`. Tensors keep their shapes ([out, in] for
// Linear weights in both) and are written as contiguous fp32 CPU tensors.
//
// Reading accepts such a dict, or a nanoGPT checkpoint (a dict whose "model"
// entry is that dict); torch.compile's "_orig_mod." prefix is dropped and
// nanoGPT's causal-mask buffers (transformer.h.N.attn.bias) are ignored.
//
// Note: strata's LayerNorms always carry a bias; with bias=false the file has
// `ln_*.bias` entries that nanoGPT's bias=False model lacks (load it with
// strict=False there).
#include "strata/recipes/models/gpt/gpt.h"

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace strata::recipes {

/// Tensors by parameter name.
using NamedTensors = std::map<std::string, torch::Tensor>;

/// nanoGPT's name for strata GPT parameter `name` (table above); an error
/// naming `name` for anything that is not a GPT parameter name.
std::string to_nanogpt_name(const std::string& name);

/// strata's name for nanoGPT parameter `name`, or "" when it names no strata
/// parameter.
std::string from_nanogpt_name(const std::string& name);

/// The file's dict: every tensor of `by_strata_name` (a GPT's parameters by
/// strata name, e.g. module.named_parameters() or a checkpoint's model
/// tensors) under its nanoGPT name, as a contiguous fp32 CPU copy; with
/// options.tie_weights() also lm_head.weight (= wte.weight).
NamedTensors to_nanogpt(const NamedTensors& by_strata_name, const GPTOptions& options);

/// Writes to_nanogpt(by_strata_name, options) to `path` (torch::pickle_save of
/// a Dict[str, Tensor]; Python: `torch.load(path)` gives a dict) atomically:
/// a temporary beside it, renamed into place. No Trainer needed.
void write_weights(const std::string& path, const NamedTensors& by_strata_name, const GPTOptions& options);

/// Reads a weights file (or a nanoGPT checkpoint, see above): tensors by
/// nanoGPT name, as stored. Errors name the path: unreadable, not a
/// torch.save / pickle_save file, or not a dict of tensors.
NamedTensors read_weights(const std::string& path);

/// Matches nanoGPT-named tensors against `model`'s parameters (their names
/// and shapes; the parameters may be deferred): returns them by strata name.
/// Every mismatch is collected into ONE error (c10::ValueError): missing
/// parameters, unexpected names, shapes (file vs model), and with tied weights
/// an lm_head.weight that differs from transformer.wte.weight. `source` names
/// the file in the message.
NamedTensors from_nanogpt(const NamedTensors& by_nanogpt_name, torch::nn::Module& model,
                          const GPTOptions& options, const std::string& source);

/// `module`'s parameters by name (the tensors themselves, not copies).
NamedTensors named_parameters_of(torch::nn::Module& module);

}  // namespace strata::recipes
