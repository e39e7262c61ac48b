#pragma once
// The Llama family as one config-driven decoder, as lit-gpt builds it: the
// families differ by fields, not by classes. Pre-RMSNorm blocks (the norm in
// fp32, as transformers computes it), grouped-query attention with rotary
// position embeddings (transformers' rotate_half layout, so that its
// checkpoints load as they are), a SwiGLU MLP, no biases by default.
//   Llama 2, Llama 3.x (with the llama3 RoPE scaling), TinyLlama, SmolLM2:
//     the defaults;
//   Mistral: the same decoder (a sliding window, when set, must cover the
//     block size);
//   Qwen2 / 2.5: biases on q, k and v only;
//   Qwen3: RMSNorm on q and k per head before RoPE, a head_dim of its own.
// Parameter names are transformers' (model.layers.0.self_attn.q_proj.weight,
// ...), so a transformers state dict needs no renaming.
//
// Example:
//   auto options = strata::recipes::llama_preset("llama-micro").vocab_size(12).block_size(11);
//   strata::recipes::LlamaModule module(options);
#include "strata/core/training_module.h"
#include "strata/recipes/models/lm.h"
#include "strata/recipes/models/lora.h"
#include "strata/strategies/pp/stage_module.h"
#include "strata/strategies/tp/plan.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace strata::recipes {

/// RoPE's frequency scaling (transformers' rope_scaling / rope_parameters):
/// "none", "linear" (every frequency divided by factor) or "llama3" (Llama
/// 3.1/3.2: long wavelengths divided by factor, short ones kept, smoothed in
/// between).
struct RopeScaling {
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct LlamaOptions {
  LlamaOptions(int64_t n_layer, int64_t n_head, int64_t n_embd, int64_t intermediate_size)
      : n_layer_(n_layer), n_head_(n_head), n_embd_(n_embd), intermediate_size_(intermediate_size) {}
  TORCH_ARG(int64_t, n_layer);
  TORCH_ARG(int64_t, n_head);
  TORCH_ARG(int64_t, n_embd);
  /// The MLP's hidden width (gate_proj's and up_proj's outputs).
  TORCH_ARG(int64_t, intermediate_size);
  /// Key/value heads (grouped-query attention): divides n_head; 0 = n_head.
  TORCH_ARG(int64_t, n_kv_head) = 0;
  /// Per-head width; 0 = n_embd / n_head (Qwen3 sets its own).
  TORCH_ARG(int64_t, head_dim) = 0;
  TORCH_ARG(int64_t, vocab_size) = 32000;
  /// The longest sequence trained on (positions 0 .. block_size - 1).
  TORCH_ARG(int64_t, block_size) = 2048;
  /// config.json's max_position_embeddings: what the model was made for (export).
  TORCH_ARG(int64_t, max_position_embeddings) = 2048;
  TORCH_ARG(double, rms_norm_eps) = 1e-5;
  TORCH_ARG(double, rope_theta) = 10000.0;
  TORCH_ARG(RopeScaling, rope_scaling);
  /// Biases on q_proj, k_proj and v_proj (Qwen2); on o_proj (Llama's
  /// attention_bias sets both); on the MLP's three projections (mlp_bias).
  TORCH_ARG(bool, qkv_bias) = false;
  TORCH_ARG(bool, o_bias) = false;
  TORCH_ARG(bool, mlp_bias) = false;
  /// RMSNorm over each head of q and k before RoPE (Qwen3).
  TORCH_ARG(bool, qk_norm) = false;
  /// lm_head shares embed_tokens' matrix.
  TORCH_ARG(bool, tie_weights) = false;
  /// Mistral's sliding window in tokens; 0 = none. One shorter than the
  /// block size is refused (full causal attention is what runs).
  TORCH_ARG(int64_t, sliding_window) = 0;
  /// "fused" (strata's CPU kernel, kernels/attention.h, with grouped queries;
  /// on other devices sdpa), "sdpa" (ATen's scaled_dot_product_attention; k
  /// and v never repeated: each kv head's query group is one longer sequence
  /// under a mask) or "naive" (the scores in memory; the reference).
  TORCH_ARG(std::string, attention) = "fused";
  /// transformers' model_type written on export: llama, mistral, qwen2, qwen3.
  TORCH_ARG(std::string, model_type) = "llama";
  /// LoRA (models/lora.h): adapters of this rank on the lora_targets
  /// projections, every other weight frozen; 0 = off.
  TORCH_ARG(int64_t, lora_rank) = 0;
  /// The adapters' output is scaled by lora_alpha / lora_rank (PEFT's default alpha 8).
  TORCH_ARG(double, lora_alpha) = 8.0;
  /// The projections that get adapters, comma-separated: q, k, v, o, gate,
  /// up, down (PEFT's target_modules; "q_proj" spellings too), or "all".
  /// PEFT's default for a Llama: q,v.
  TORCH_ARG(std::string, lora_targets) = "q,v";

 public:
  int64_t kv_heads() const { return n_kv_head_ > 0 ? n_kv_head_ : n_head_; }
  int64_t head_size() const { return head_dim_ > 0 ? head_dim_ : n_embd_ / n_head_; }
};

/// Which of a block's projections get LoRA adapters.
struct LlamaLoraTargets {
  bool q = false, k = false, v = false, o = false, gate = false, up = false, down = false;
  /// Adapters in the attention (q, k, v, o) or the MLP (gate, up, down).
  bool attention() const { return q || k || v || o; }
  bool mlp() const { return gate || up || down; }
  /// Column-parallel (q, k, v, gate, up) and row-parallel (o, down) ones.
  int64_t column_count() const { return q + k + v + gate + up; }
  int64_t row_count() const { return o + down; }
};

/// lora_targets' text as a set: q, k, v, o, gate, up, down or their
/// transformers names (q_proj, ..., down_proj), comma-separated, each once;
/// "all" for the seven. Anything else is a one-line error naming the value
/// and what is allowed.
LlamaLoraTargets parse_llama_lora_targets(const std::string& text);

/// The adapter parameters of a model with these options (0 without LoRA);
/// with `tp_size` > 1, those of the largest tensor-parallel rank (a column
/// adapter's B and a row adapter's A split, the other matrix whole).
int64_t count_llama_lora_parameters(const LlamaOptions& options, int tp_size = 1);

/// Presets with the shapes of the published config.json of each model
/// (llama-3.2-1b, llama-3.1-8b, llama-3.1-70b, llama-3.1-405b,
/// qwen2.5-0.5b, qwen3-0.6b, qwen3-8b, smollm2-135m, tinyllama-1.1b,
/// mistral-7b) and small ones for tests (llama-nano, llama-micro,
/// llama-mini: gpt-nano's, gpt-micro's and gpt-mini's sizes, 2 kv heads).
/// Unknown names are an error listing these.
LlamaOptions llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();

/// "" when the model splits over `size` tensor-parallel ranks: query and kv
/// heads (each rank its kv heads' whole query groups) and the MLP width
/// divide by it, the vocabulary is no smaller, and with sequence parallelism
/// the block size divides too; else why not, naming the values. A kv head
/// count that `size` does not divide is refused rather than replicated.
std::string tensor_parallel_problem(const LlamaOptions& options, int size, bool sequence_parallel);

/// One-line errors naming the values: sizes <= 0, n_kv_head not dividing
/// n_head, an odd head size (RoPE rotates pairs), a sliding window shorter
/// than the block size, an unknown RoPE scaling or attention, a LoRA rank
/// outside [0, n_embd], alpha <= 0 or unknown targets.
void validate(const LlamaOptions& options);

/// Parameters, counted from the options: per block the four attention
/// projections (and their biases), the MLP's three, two norms (and q/k
/// norms) and LoRA's adapters; the embedding, the final norm and an untied head.
int64_t count_parameters(const LlamaOptions& options);

/// 6 N + 12 L H D T FLOPs per token of a training step (N: the parameters
/// but an untied embedding table, whose lookup is no product). Under LoRA
/// frozen weights take no weight-gradient product: 4 N + 2 N_trainable.
double llama_flops_per_token(const LlamaOptions& options);

/// RoPE's inverse frequencies [head_size / 2] in fp32, as transformers
/// computes them (its _compute_default / _linear / _llama3 rope parameters).
torch::Tensor rope_inverse_frequencies(const LlamaOptions& options);

/// What every block's attention reads, made once per forward of T tokens
/// (not once per layer): RoPE's cos and sin [T, D] in fp32 for positions
/// 0 .. T-1, and with grouped queries (G = n_head / n_kv_head > 1) the causal
/// mask of G·T rows (row i is position i mod T) over T columns; undefined for
/// G = 1, which runs SDPA's own causal path.
/// Generation's keys and values of the positions so far, per layer [B, kv, L, D].
struct KVCache {
  std::vector<torch::Tensor> k, v;
  int64_t length = 0;
};

/// With `cache` (generation) each attention appends its keys and values to
/// layer `layer`'s and attends over all of them.
struct AttentionInputs {
  torch::Tensor cos, sin, mask;
  KVCache* cache = nullptr;
  size_t layer = 0;
};
/// For positions start .. start + T - 1.
AttentionInputs attention_inputs(const torch::Tensor& inverse_frequencies, int64_t T, int64_t group,
                                 const torch::Device& device, int64_t start = 0);

/// x [B, H, T, D] rotated in transformers' layout: x · cos + rotate_half(x) ·
/// sin, rotate_half(x) = (-x[D/2:], x[:D/2]); cos and sin from
/// attention_inputs, cast to x's dtype. On a CPU strata's fused kernel
/// (kernels/rope.h, computed in fp32 and rounded once).
torch::Tensor apply_rope(const torch::Tensor& x, const AttentionInputs& in);

/// transformers' RMSNorm: in fp32, x · rsqrt(mean(x²) + eps), cast back to
/// x's dtype, then times the weight. On a CPU strata's fused kernel
/// (kernels/rms_norm.h), elsewhere rms_norm_composite, ATen's ops as
/// transformers runs them.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps);

/// A Linear's parameters, `weight` [out, in] and `bias` [out] (undefined
/// without one), made without values: on the meta device when `deferred`,
/// else uninitialised until LlamaImpl::init_parameter fills them. (torch's
/// Linear and Embedding allocate and draw their own init in the
/// constructor: a deferred build of llama-3.1-405b would allocate and fill
/// 12.8 GB per layer only to drop it.) The embedding table is one too:
/// `weight` [vocab, n_embd].
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in, int64_t out, bool bias, bool deferred);
  torch::Tensor weight, bias;
};
TORCH_MODULE(Projection);

/// RMSNorm as a module (its parameter is `weight`), computed by rms_norm().
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  /// Under sequence parallelism (`tp`) the weight's gradient is summed over
  /// the ranks' tokens.
  torch::Tensor forward(const torch::Tensor& x, const tp::Parallel& tp = {}) {
    return rms_norm(x, tp.replicated(weight), eps_);
  }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaOptions& options, bool deferred);
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in);
  void set_tensor_parallel(const tp::Parallel& tp) { tp_ = tp; }

 private:
  /// Generation: attention over the cache's keys and values and these.
  torch::Tensor cached_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, const AttentionInputs& in) const;

  tp::Parallel tp_;
  LlamaOptions options_;
  Projection q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
  RMSNorm q_norm_{nullptr}, k_norm_{nullptr};  // null without qk_norm
  LoRA q_lora_{nullptr}, k_lora_{nullptr}, v_lora_{nullptr}, o_lora_{nullptr};  // null where not targeted
};
TORCH_MODULE(LlamaAttention);

class LlamaBlockImpl : public torch::nn::Module {
 public:
  LlamaBlockImpl(const LlamaOptions& options, bool deferred);
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in);
  void set_tensor_parallel(const tp::Parallel& tp);

 private:
  tp::Parallel tp_;
  RMSNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  LlamaAttention self_attn_{nullptr};
  Projection gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
  LoRA gate_lora_{nullptr}, up_lora_{nullptr}, down_lora_{nullptr};  // null where not targeted
};
TORCH_MODULE(LlamaBlock);

class LlamaImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model from torch's default generator's seed
  /// (init_parameter); `deferred`: parameters on the meta device until a
  /// strategy's setup, as GPTImpl does.
  explicit LlamaImpl(const LlamaOptions& options, bool deferred = false);
  /// idx: int64 [B, T], T <= block_size; logits [B, T, vocab]. Block i runs
  /// through `run_unit` (the unit seam) when given.
  torch::Tensor forward(const torch::Tensor& idx, const UnitRunner& run_unit = nullptr);
  /// forward's parts, which pipeline stages run apart (llama_pipeline.cpp):
  /// the token embedding of `idx` [B, T]; blocks [from, to) (block i through
  /// `run_unit` as unit i when given) on `x` of a T-token sequence; the final
  /// norm and the head's logits.
  torch::Tensor embed(const torch::Tensor& idx);
  torch::Tensor run_blocks(torch::Tensor x, int64_t T, int64_t from, int64_t to, const UnitRunner& run_unit = nullptr);
  torch::Tensor head(const torch::Tensor& x);
  /// Generation: the logits of `idx` [B, T] after the cache's positions (the
  /// prompt into an empty cache, then one token at a time), which it extends.
  torch::Tensor forward_cached(const torch::Tensor& idx, KVCache& cache);
  const LlamaOptions& options() const { return options_; }
  std::vector<LlamaBlock>& blocks() { return blocks_; }
  /// Initialisation of parameter `name`, in place, from its own generator
  /// (seed, name): matrices N(0, 0.02) (transformers' initializer_range),
  /// norms 1, biases 0, LoRA's A as a Linear's weight and B 0.
  void init_parameter(const std::string& name, const torch::Tensor& param) const;
  /// The forward calls `tp` from now on (the parameters were split by
  /// LlamaModule::tensor_parallel_plan); its logits are then this rank's part
  /// of the vocabulary.
  void set_tensor_parallel(const tp::Parallel& tp);
  const tp::Parallel& tensor_parallel() const { return tp_; }

 private:
  tp::Parallel tp_;
  LlamaOptions options_;
  uint64_t init_seed_ = 0;
  torch::Tensor inverse_frequencies_;  // rope_inverse_frequencies(options_), CPU fp32
  std::shared_ptr<torch::nn::Module> body_;  // "model": embed_tokens, layers, norm
  Projection embed_tokens_{nullptr};  // weight [vocab, n_embd]
  std::vector<LlamaBlock> blocks_;
  RMSNorm norm_{nullptr};
  Projection lm_head_{nullptr};  // null when tied
};
TORCH_MODULE(Llama);

/// The Llama as a TrainingModule: next-token cross-entropy (targets of -1
/// ignored), exact-match accuracy for validation; the blocks are the units.
/// Tensor parallel as Megatron splits a Llama: q, k and v projections and
/// the MLP's gate and up column-parallel (each rank its kv heads with their
/// query groups, never repeated), o_proj and down_proj row-parallel, the
/// embedding and head along the vocabulary with a vocabulary-parallel
/// cross-entropy.
class LlamaModule : public TrainingModule, public tp::TensorParallelModel, public LanguageModelStages {
 public:
  explicit LlamaModule(const LlamaOptions& options, bool deferred = false);
  torch::nn::Module& module() override { return *model_; }
  void init_parameter(const std::string& name, const torch::Tensor& param) override;
  torch::Tensor training_step(const Batch& batch) override;
  ValidationStep validation_step(const Batch& batch) override;
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override;
  /// 6 N + 12 L H D T per token (N: parameters but an untied embedding
  /// table, whose lookup is no product).
  double flops_per_token() const override;
  tp::Plan tensor_parallel_plan() const override;
  std::string tensor_parallel_problem(int size, bool sequence_parallel) const override;
  void set_tensor_parallel(const tp::Parallel& parallel) override { model_->set_tensor_parallel(parallel); }
  // pp::PipelineModel (llama_pipeline.cpp): the decoder layers; the first
  // stage runs the token embedding, the last the final norm, the head and the
  // loss; a tied embed_tokens is both stages'.
  int64_t pipeline_blocks() const override { return model_->options().n_layer(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> stage_children(
      const pp::StageCut& cut) override;
  torch::Tensor stage_forward(const pp::StageCut& cut, const torch::Tensor& x, const pp::BlockRunner& run) override;
  std::vector<std::string> tied_parameters() const override;
  /// Parameters: a layer's, the embedding's, the final norm and head's.
  std::vector<double> block_costs() const override;
  std::pair<double, double> end_costs() const override;
  Llama& model() { return model_; }

 protected:
  // LanguageModelStages: the loss, validation and activation as the model runs.
  const tp::Parallel& stage_parallel() const override { return model_->tensor_parallel(); }
  int64_t stage_vocab() const override { return model_->options().vocab_size(); }
  int64_t stage_width() const override { return model_->options().n_embd(); }

 private:
  torch::Tensor forward(const torch::Tensor& idx);
  Llama model_;
};

}  // namespace strata::recipes
