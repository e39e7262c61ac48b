#pragma once
// A user's own model family, registered with strata's ModelRegistry exactly as
// the built-in GPT and Llama are (strata/recipes/models/spec.h): a bigram MLP
// language model (each position's next token from its own token: an
// embedding, residual MLP blocks, a head). Registered, it is a --preset of
// this project's strata-gpt with its keys, --help line, config.ini keys,
// --strategy auto's table, --dry-run at any world size and every strategy.
//
//   strata::recipes::ModelRegistry models;
//   strata::recipes::register_builtin_models(models);
//   models.add(own_model::bigram_mlp_spec());
//   return strata::recipes::run_gpt(argc, argv, strategies, models);
#include <strata/recipes/models/spec.h>

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace own_model {

struct BigramMlpOptions {
  TORCH_ARG(int64_t, n_layer) = 2;
  TORCH_ARG(int64_t, n_embd) = 64;
  TORCH_ARG(int64_t, vocab_size) = 256;
  TORCH_ARG(int64_t, block_size) = 64;
};

/// The model as a TrainingModule: deferred-buildable (init_parameter draws
/// each parameter from its own generator), its blocks the wrap units.
class BigramMlp : public strata::TrainingModule {
 public:
  BigramMlp(const BigramMlpOptions& options, bool deferred);
  torch::nn::Module& module() override { return *root_; }
  torch::Tensor training_step(const strata::Batch& batch) override;
  strata::ValidationStep validation_step(const strata::Batch& batch) override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override { return blocks_; }
  double flops_per_token() const override;
  void init_parameter(const std::string& name, const torch::Tensor& param) override;

 private:
  torch::Tensor forward(const torch::Tensor& idx);
  BigramMlpOptions options_;
  uint64_t seed_ = 0;
  std::shared_ptr<torch::nn::Module> root_;  // "embed", "blocks.<i>", "head"
  std::shared_ptr<torch::nn::EmbeddingImpl> embed_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  std::shared_ptr<torch::nn::LinearImpl> head_;
};

/// The family's ModelConfig: counts, FLOPs, the step's matrix products and
/// an activation formula; no tensor-parallel plan and no weights format (the
/// interface's defaults: tp refused beyond one rank, --export-weights
/// refused, checkpoints as for any model).
class BigramMlpConfig : public strata::recipes::ModelConfig {
 public:
  explicit BigramMlpConfig(BigramMlpOptions options);
  std::string family() const override { return "bigram-mlp"; }
  strata::recipes::ModelShape shape() const override;
  std::map<std::string, double> resolved_numbers() const override;
  strata::recipes::ModelPtr with_layers(int64_t n_layer) const override;
  std::unique_ptr<strata::TrainingModule> build(bool deferred,
                                                strata::recipes::ParameterSourcePtr source = nullptr) const override;
  int64_t parameters() const override;
  strata::ModelSize size(int tp_size = 1) const override;
  double flops_per_token() const override;
  std::vector<strata::recipes::GemmShape> step_gemms(int64_t tokens) const override;
  strata::recipes::ActivationProfile activation_formula(int64_t micro_batch, strata::Precision precision,
                                                        const std::string& ac_policy) const override;

 private:
  BigramMlpOptions options_;
};

/// "bigram-mlp": presets bigram-mlp-small (2 x 64) and bigram-mlp-wide
/// (2 x 256), keys n-layer and n-embd; the vocabulary and block size are the
/// data's.
strata::recipes::ModelSpec bigram_mlp_spec();

}  // namespace own_model
