#pragma once
// The GPT's ModelSpec (models/spec.h): nanoGPT's GPT-2 presets, its command
// line keys, and the GPT as a ModelConfig: counts from GPTOptions, nanoGPT's
// FLOPs, the step's matrix products, the activation formula fitted to its
// probe, Megatron's tensor-parallel split, and weights under nanoGPT's names
// (torch.save or safetensors files, transformers GPT-2 directories).
//
// Example:
//   strata::recipes::ModelPtr model = strata::recipes::gpt_model(strata::recipes::gpt_preset("gpt-micro"));
//   auto module = model->build(/*deferred=*/false);
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/spec.h"

namespace strata::recipes {

class GPTConfig : public ModelConfig {
 public:
  /// Throws (validate) for options that do not make a GPT.
  explicit GPTConfig(GPTOptions options);
  const GPTOptions& options() const { return options_; }

  std::string family() const override { return "gpt"; }
  ModelShape shape() const override;
  ModelPtr with_layers(int64_t n_layer) const override;
  std::unique_ptr<TrainingModule> build(bool deferred, ParameterSourcePtr source = nullptr) const override;
  int64_t parameters() const override { return count_parameters(options_); }
  int64_t trainable_parameters() const override { return count_trainable_parameters(options_); }
  ModelSize size(int tp_size = 1) const override;
  double flops_per_token() const override { return gpt_flops_per_token(options_); }
  std::vector<GemmShape> step_gemms(int64_t tokens) const override;
  /// Fitted to the probe on gpt-nano/micro/mini (fp32, fused attention, no
  /// dropout): a block keeps ~16 x B·T·C floats (+ 3 x B·H·T² for naive
  /// attention), the base ~3 x B·T·V + 4 x B·T·C; bf16 halves a block's.
  ActivationProfile activation_formula(int64_t micro_batch, Precision precision,
                                       const std::string& ac_policy) const override;
  std::string tensor_parallel_problem(int size, bool sequence_parallel) const override;
  tp::Boundaries tensor_parallel_boundaries(int64_t micro_batch, int64_t sequence,
                                            int64_t checkpoint_every) const override;
  /// nanoGPT-named weights (torch.save or safetensors) or a transformers
  /// GPT-2 directory, whose config.json must describe this model.
  ParameterSourcePtr read_weights(const std::string& path) const override;
  /// "pt": torch.save's format under nanoGPT's names; "hf": a transformers
  /// GPT2LMHeadModel directory (needs biases). LoRA adapters merged.
  std::vector<std::string> weight_formats() const override;
  void write_weights(const std::string& path, const NamedTensors& params, const std::string& format) const override;
  std::string export_problem(const std::string& path, const std::string& format) const override;
  std::unique_ptr<IncrementalDecoder> decoder(TrainingModule& module) const override;
  bool positions_learned() const override { return true; }
  std::map<std::string, double> resolved_numbers() const override;
  /// lora-targets under LoRA (config.ini records what ran).
  std::map<std::string, std::string> resolved_texts() const override;

 private:
  GPTOptions options_;
};

/// `options` as a ModelConfig.
ModelPtr gpt_model(const GPTOptions& options);

/// The gpt family: gpt_preset_names(), the keys n-layer, n-head, n-embd,
/// dropout, bias, attention, activation, init-std, lora-rank, lora-alpha,
/// lora-targets; the data's vocabulary and block size.
ModelSpec gpt_model_spec();

}  // namespace strata::recipes
