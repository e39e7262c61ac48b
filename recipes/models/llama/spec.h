#pragma once
// The Llama family's ModelSpec (models/spec.h): the presets of llama.h, the
// command line keys it reads, and a transformers checkpoint directory of a
// Llama, Mistral, Qwen2 or Qwen3 model as --init-from (its config.json gives
// the model, so no --preset is needed). As a ModelConfig: counts per
// tensor-parallel rank, FLOPs, the step's matrix products and an activation
// formula, and weights under transformers' names in and out.
//
// Example:
//   auto model = strata::recipes::llama_model(strata::recipes::llama_preset("llama-micro"));
//   auto module = model->build(/*deferred=*/false);
#include "strata/recipes/models/llama/llama.h"
#include "strata/recipes/models/spec.h"

namespace strata::recipes {

class LlamaConfig : public ModelConfig {
 public:
  /// Throws (validate) for options that do not make a model. `source`: the
  /// transformers directory they were read from ("" for a preset);
  /// `adapter`: a PEFT adapter directory whose LoRA weights read_weights
  /// gives the adapters ("": they start from LoRA's init).
  explicit LlamaConfig(LlamaOptions options, std::string source = "", std::string adapter = "");
  const LlamaOptions& options() const { return options_; }

  std::string family() const override { return "llama"; }
  ModelShape shape() const override;
  ModelPtr with_layers(int64_t n_layer) const override;
  std::unique_ptr<TrainingModule> build(bool deferred, ParameterSourcePtr source = nullptr) const override;
  int64_t parameters() const override { return count_parameters(options_); }
  /// Under LoRA its adapters.
  int64_t trainable_parameters() const override;
  /// Per rank under tensor parallelism: q/k/v, gate/up and their biases,
  /// o/down's weights, the embedding and an untied head split; norms and
  /// o/down biases whole.
  ModelSize size(int tp_size = 1) const override;
  double flops_per_token() const override { return llama_flops_per_token(options_); }
  std::vector<GemmShape> step_gemms(int64_t tokens) const override;
  /// Per block ~(6C + 3 H·D + 3 KV·D + 4 I) floats per token kept for
  /// backward (norm inputs and outputs, q/k/v before and after RoPE, the
  /// attention output, gate, up, SiLU and their product), the base as the GPT's.
  ActivationProfile activation_formula(int64_t micro_batch, Precision precision,
                                       const std::string& ac_policy) const override;
  std::string tensor_parallel_problem(int size, bool sequence_parallel) const override;
  /// As the GPT's: per block o_proj's and down_proj's sums forward, q/k/v's
  /// and gate/up's input gradients backward, the embedding and the head.
  tp::Boundaries tensor_parallel_boundaries(int64_t micro_batch, int64_t sequence,
                                            int64_t checkpoint_every) const override;
  /// A transformers directory (single or sharded safetensors): every
  /// parameter present with its shape, nothing else but a tied head's copy
  /// and stored RoPE buffers.
  ParameterSourcePtr read_weights(const std::string& path) const override;
  /// "hf": a transformers directory, config.json in the family's own
  /// model_type and model.safetensors (sharded above 5 GiB, with its index);
  /// the tokenizer's files copied from source_directory() when it has them.
  /// hf: a transformers directory, LoRA merged; peft: a LoRA run's adapters
  /// as PEFT saves them (adapter_config.json, adapter_model.safetensors).
  std::vector<std::string> weight_formats() const override { return {"hf", "peft"}; }
  void write_weights(const std::string& path, const NamedTensors& params, const std::string& format) const override;
  std::string export_problem(const std::string& path, const std::string& format) const override;
  std::string source_directory() const override { return source_; }
  std::vector<std::string> source_keys() const override;
  std::unique_ptr<IncrementalDecoder> decoder(TrainingModule& module) const override;
  /// attention, and lora-targets under LoRA (the family's default is PEFT's q,v).
  std::map<std::string, double> resolved_numbers() const override;
  std::map<std::string, std::string> resolved_texts() const override;

 private:
  LlamaOptions options_;
  std::string source_;
  std::string adapter_;
};

/// `options` as a ModelConfig; `source`: the transformers directory they
/// were read from ("" for a preset); `adapter`: a PEFT adapter directory
/// the adapters start from.
ModelPtr llama_model(const LlamaOptions& options, const std::string& source = "", const std::string& adapter = "");

/// The llama family: llama_preset_names() or an --init-from transformers
/// directory; the keys n-layer, n-head, n-embd (presets only), attention and
/// LoRA's (lora-rank, lora-alpha, lora-targets: q,v unless given).
/// From a preset the vocabulary and block size are the data's; from a
/// directory its config's vocabulary (no smaller than the data's) and the
/// data's block size (no longer than max_position_embeddings).
ModelSpec llama_model_spec();

}  // namespace strata::recipes
