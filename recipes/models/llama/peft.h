#pragma once
// Hugging Face PEFT's LoRA adapter directories (adapter_config.json and
// adapter_model.safetensors), in and out, for the Llama family. PEFT's key
// base_model.model.<module>.lora_A.weight is strata's <module>_lora.A (and
// lora_B, B), the same [r, in] and [out, r] layouts, so both ways are a
// rename. PEFT's scale is lora_alpha / r, as strata's (lora.h).
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/llama/llama.h"

#include <map>
#include <string>

namespace strata::recipes {

/// An adapter directory as read: LoRA's options and where each adapter
/// tensor's bytes are, under strata's parameter names.
struct PeftLora {
  int64_t rank = 0;
  double alpha = 0.0;                                ///< strata's: scale = alpha / rank
  std::string targets;                               ///< --lora-targets' spelling ("q,v")
  std::map<std::string, SafetensorsEntry> weights;  ///< "<module>_lora.A" -> its entry
};

/// Reads `dir`'s adapter_config.json and adapter_model.safetensors' header.
/// Refused, with one line naming the file and the key: not LoRA, DoRA, a
/// bias, fan_in_fan_out, modules_to_save, per-layer rank or alpha patterns,
/// layers_to_transform, target modules outside q..down, or a tensor key
/// that is not an adapter of those. use_rslora (scale alpha / sqrt(r)) is
/// read as strata's alpha * sqrt(r), the same scale.
PeftLora read_peft_lora(const std::string& dir);

/// Writes the LoRA parameters of `params` (strata's names; others ignored)
/// to `dir` as PEFT saves them, with `options`' r, alpha and targets and
/// `base` as base_model_name_or_path.
void write_peft_lora(const std::string& dir, const std::map<std::string, torch::Tensor>& params,
                     const LlamaOptions& options, const std::string& base);

}  // namespace strata::recipes
