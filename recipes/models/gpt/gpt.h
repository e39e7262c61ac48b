#pragma once
// nanoGPT-style GPT: token + position embeddings, pre-LayerNorm blocks with
// causal self-attention and a GELU MLP, optional weight tying, dropout.
//
// Example:
//   auto options = strata::recipes::gpt_preset("gpt-mini").vocab_size(12).block_size(11);
//   strata::recipes::GPTModule module(options);
#include "strata/core/training_module.h"
#include "strata/recipes/models/lm.h"
#include "strata/recipes/models/lora.h"
#include "strata/strategies/pp/stage_module.h"
#include "strata/strategies/tp/plan.h"
#include "strata/strategies/tp/spec.h"

#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

namespace strata::recipes {

struct GPTOptions {
  GPTOptions(int64_t n_layer, int64_t n_head, int64_t n_embd)
      : n_layer_(n_layer), n_head_(n_head), n_embd_(n_embd) {}
  TORCH_ARG(int64_t, n_layer);
  TORCH_ARG(int64_t, n_head);
  TORCH_ARG(int64_t, n_embd);
  /// GPT-2's 50257 padded to a multiple of 64, as nanoGPT does.
  TORCH_ARG(int64_t, vocab_size) = 50304;
  TORCH_ARG(int64_t, block_size) = 1024;
  TORCH_ARG(double, dropout) = 0.0;
  /// Biases in Linear layers and LayerNorms.
  TORCH_ARG(bool, bias) = true;
  /// lm_head shares the token embedding matrix.
  TORCH_ARG(bool, tie_weights) = true;
  /// The attention core: "fused" (kernels/attention.h: tiled, online softmax,
  /// O(B·H·T) activation memory, on CPU; on CUDA LibTorch's SDPA), "sdpa"
  /// (at::scaled_dot_product_attention on any device) or "naive" (B×H×T×T
  /// scores kept for backward; the reference).
  TORCH_ARG(std::string, attention) = "fused";
  /// The MLP's GELU: "gelu" (exact, erf; nanoGPT's) or "gelu_new" (the tanh
  /// approximation OpenAI's GPT-2 and transformers' "gelu_new" compute).
  TORCH_ARG(std::string, activation) = "gelu";
  /// The weight matrices' init std (the residual projections' c_proj is
  /// divided by sqrt(2 n_layer), as GPT-2's). 0: gpt_init_std(n_embd), GPT-2's
  /// 0.02 scaled to the width; 0.02 gives nanoGPT's init at every width.
  TORCH_ARG(double, init_std) = 0.0;
  /// LoRA adapters (recipes/models/lora.h): rank 0 = off. With rank r > 0 the
  /// targeted Linears gain (alpha / r) · B A and every other parameter is
  /// frozen. alpha 8 and targets attn are PEFT LoraConfig's defaults for GPT-2.
  TORCH_ARG(int64_t, lora_rank) = 0;
  TORCH_ARG(double, lora_alpha) = 8.0;
  TORCH_ARG(std::string, lora_targets) = "attn";
};

/// Which of the GPT's Linear layers get LoRA adapters: attn (attn.c_attn,
/// attn.c_proj), mlp (c_fc, c_proj), or both.
struct LoraTargets {
  bool attn = false;
  bool mlp = false;
};

/// "attn", "mlp", "attn,mlp" (either order); anything else is an error
/// naming the value and what is allowed.
LoraTargets parse_lora_targets(const std::string& text);

/// The adapter parameters a GPT with these options has (0 without LoRA); with
/// `tp_size` > 1, those of one tensor-parallel rank.
int64_t count_lora_parameters(const GPTOptions& options, int tp_size = 1);

/// GPT-2's init std 0.02 belongs to its width 768 (about 0.55 / sqrt(768),
/// the fan-in rule): below that width 0.02 · sqrt(768 / n_embd), at 768 and
/// wider 0.02. At gpt-micro's 128 it is 0.049: with 0.02 there the addition
/// task sat on a plateau at some seeds (docs/default-job.md).
double gpt_init_std(int64_t n_embd);
/// options.init_std(), or gpt_init_std(n_embd) when it is 0.
double init_std_of(const GPTOptions& options);

/// The values GPTOptions::attention accepts: fused, sdpa, naive.
std::vector<std::string> attention_names();

/// gpt-nano (3 layers, 3 heads, 48 wide), gpt-micro (4, 4, 128),
/// gpt-mini (6, 6, 192), gpt2 (12, 12, 768; 124M), gpt2-medium (24, 16, 1024),
/// gpt2-large (36, 20, 1280), gpt2-xl (48, 25, 1600). Unknown names are an
/// error listing these.
GPTOptions gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

/// Errors (one line, naming the values) for n_embd % n_head != 0,
/// non-positive sizes, an unknown attention implementation and bad LoRA
/// options.
void validate(const GPTOptions& options);

/// "" when a GPT with these options splits over `size` tensor-parallel ranks
/// (GPTModule::tensor_parallel_plan): heads and the MLP width divide by it,
/// the vocabulary is no smaller, and with sequence parallelism the block
/// size divides too; else why not, naming the values.
std::string tensor_parallel_problem(const GPTOptions& options, int size, bool sequence_parallel);

/// The crossings of its tensor-parallel forward (GPTModule's plan) per
/// micro-batch of `micro_batch` sequences of `sequence` tokens, with every
/// `checkpoint_every`-th block checkpointed (0: none): per block two
/// row-parallel sums forward and two column-parallel input gradients
/// backward, the embedding's sum and the head's input gradient.
tp::Boundaries tensor_parallel_boundaries(const GPTOptions& options, int64_t micro_batch, int64_t sequence,
                                          int64_t checkpoint_every);

/// Parameters the largest rank holds when split over `size` ranks (the
/// vocabulary's uneven split rounds up): per block (12C² + 7C·bias) / size
/// split plus 4C + 2C·bias replicated; the embedding (and an untied head)
/// split, the position embeddings and the final LayerNorm replicated; LoRA
/// adapters as count_lora_parameters(options, size) (the block count
/// leaves them out).
int64_t count_tensor_parallel_parameters(const GPTOptions& options, int size);
int64_t count_tensor_parallel_block_parameters(const GPTOptions& options, int size);

/// The parameters a GPT with these options has, counted from the options
/// (before building it): for planning memory and disk space. LoRA adapters
/// included; count_lora_parameters() are the trainable ones under LoRA.
int64_t count_parameters(const GPTOptions& options);
/// The parameters training updates: all of them, or the adapters under LoRA.
int64_t count_trainable_parameters(const GPTOptions& options);

/// nanoGPT's estimate of a training step's FLOPs per token, 6N + 12·L·H·Q·T
/// (N without the position embeddings; under LoRA frozen weights take no
/// weight-gradient product: 4 per parameter and token, 6 for the adapters).
double gpt_flops_per_token(const GPTOptions& options);

/// Generation: each block's keys and values so far, and how many positions.
struct GPTKVCache {
  std::vector<torch::Tensor> k, v;
  int64_t length = 0;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  /// Generation (gpt_cached.cpp): `x`'s keys and values appended to `k` and
  /// `v` (undefined before the prompt), attending over all of them.
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v);
  /// Tensor parallelism (strategies/tp): this rank's heads.
  void set_tensor_parallel(const tp::Parallel& tp) { tp_ = tp; }

 private:
  /// q, k, v [B, heads, T, head_dim] of `x`.
  std::array<torch::Tensor, 3> heads(const torch::Tensor& x);
  /// The attended heads [B, heads, T, head_dim] through c_proj.
  torch::Tensor project(const torch::Tensor& attended);

  tp::Parallel tp_;
  int64_t n_head_;
  std::string attention_;
  double attn_dropout_p_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  LoRA c_attn_lora_{nullptr}, c_proj_lora_{nullptr};  // null without LoRA on attn
  torch::nn::Dropout attn_dropout_{nullptr}, resid_dropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  /// Generation (gpt_cached.cpp): the attention's keys and values kept in `k`, `v`.
  torch::Tensor forward_cached(const torch::Tensor& x, torch::Tensor& k, torch::Tensor& v);
  void set_tensor_parallel(const tp::Parallel& tp);

 private:
  /// The MLP's output (dropout applied) for its input `in`, one process.
  torch::Tensor mlp(const torch::Tensor& in);

  tp::Parallel tp_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
  LoRA c_fc_lora_{nullptr}, c_proj_lora_{nullptr};  // null without LoRA on mlp
  torch::nn::Dropout dropout_{nullptr};
  std::string approximate_;  // torch::gelu's: "none" or "tanh"
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model (GPT-2 init, init_parameter()) from the
  /// seed of torch's default generator (torch::manual_seed). `deferred`:
  /// each submodule is built as usual (consuming the default generator
  /// exactly as an eager build does) and its parameters are moved to the
  /// meta device at once (core/deferred_init.h), so building peaks at one
  /// submodule; a strategy's setup later materialises them and calls
  /// init_parameter(), which gives the eager values bit for bit.
  explicit GPTImpl(const GPTOptions& options, bool deferred = false);
  /// idx: int64 [B, T] with T <= block_size; returns logits [B, T, vocab].
  /// Block i runs as `run_unit(i, x, block i's forward)` when `run_unit` is
  /// given (GPTModule passes TrainingModule::run_unit, the unit seam), else
  /// directly.
  torch::Tensor forward(const torch::Tensor& idx, const UnitRunner& run_unit = nullptr);
  /// forward's parts, which pipeline stages run apart (gpt_pipeline.cpp): the
  /// token and position embeddings of `idx` [B, T] (with dropout), and the
  /// final norm and head's logits of the last block's output.
  torch::Tensor embed(const torch::Tensor& idx);
  torch::Tensor head(const torch::Tensor& x);
  /// Generation (gpt_cached.cpp): the logits of `idx` [B, T] after the
  /// `cache.length` positions fed before (the prompt first, then one token at
  /// a time), in eval mode, without tensor parallelism.
  torch::Tensor forward_cached(const torch::Tensor& idx, GPTKVCache& cache);
  const GPTOptions& options() const { return options_; }
  std::vector<Block>& blocks() { return blocks_; }
  /// Parameter count; nanoGPT excludes position embeddings for FLOP counting.
  /// Counted at construction: under FSDP the parameters hold 0 elements
  /// between units' runs, but the model keeps its size.
  int64_t num_params(bool non_embedding = false) const;
  /// GPT-2 initialisation of parameter `name` (as in named_parameters()),
  /// in place: N(0, s) with s = init_std_of(options) (0.02 at GPT-2's
  /// widths), zero biases, LayerNorm 1 / 0, residual projections
  /// (c_proj.weight) N(0, s / sqrt(2 * n_layer)). Each
  /// parameter draws from its own generator seeded from (init_seed(), name):
  /// the values depend on neither the order nor the place of initialisation.
  void init_parameter(const std::string& name, const torch::Tensor& param) const;
  /// The default generator's seed when the model was built.
  uint64_t init_seed() const { return init_seed_; }
  /// Tensor parallelism: the forward calls `tp` (the parameters were split
  /// by GPTModule::tensor_parallel_plan()); its logits are then this rank's
  /// part of the vocabulary.
  void set_tensor_parallel(const tp::Parallel& tp);
  const tp::Parallel& tensor_parallel() const { return tp_; }

 private:
  tp::Parallel tp_;
  GPTOptions options_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::Dropout drop_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear lm_head_{nullptr};  // null when tied to wte
  int64_t num_params_ = 0;               // all parameters, at construction
  uint64_t init_seed_ = 0;
};
TORCH_MODULE(GPT);

/// The GPT as a TrainingModule: next-token cross-entropy (targets of -1 are
/// ignored), exact-match accuracy over scored positions for validation.
/// Tensor parallel (strategies/tp/plan.h) Megatron's way: the QKV projection
/// and the MLP's first Linear column-parallel (whole heads per rank), the
/// two output projections row-parallel, the embedding and the head split
/// along the vocabulary with a vocabulary-parallel cross-entropy.
class GPTModule : public TrainingModule, public tp::TensorParallelModel, public LanguageModelStages {
 public:
  /// `deferred`: parameters on the meta device until a strategy's setup
  /// (GPTImpl's constructor).
  explicit GPTModule(const GPTOptions& options, bool deferred = false);
  torch::nn::Module& module() override { return *model_; }
  /// GPTImpl::init_parameter.
  void init_parameter(const std::string& name, const torch::Tensor& param) override;
  torch::Tensor training_step(const Batch& batch) override;
  ValidationStep validation_step(const Batch& batch) override;
  /// The blocks, in order: block i is unit i of the unit seam.
  std::vector<std::shared_ptr<torch::nn::Module>> wrap_units() override;
  /// nanoGPT's estimate: 6N + 12·L·H·Q·T FLOPs per token (fwd + bwd).
  double flops_per_token() const override;
  tp::Plan tensor_parallel_plan() const override;
  /// Heads and the MLP width must divide by `size`; sequence parallel: the
  /// block size too. LoRA is not split yet.
  std::string tensor_parallel_problem(int size, bool sequence_parallel) const override;
  void set_tensor_parallel(const tp::Parallel& parallel) override { model_->set_tensor_parallel(parallel); }
  // pp::PipelineModel (gpt_pipeline.cpp): the blocks; the first stage runs
  // the embeddings, the last the final norm, the head and the loss; a tied
  // wte is both stages'.
  int64_t pipeline_blocks() const override { return model_->options().n_layer(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> stage_children(
      const pp::StageCut& cut) override;
  torch::Tensor stage_forward(const pp::StageCut& cut, const torch::Tensor& x, const pp::BlockRunner& run) override;
  std::vector<std::string> tied_parameters() const override;
  /// Parameters: a block's, the embeddings', the final norm and head's.
  std::vector<double> block_costs() const override;
  std::pair<double, double> end_costs() const override;
  /// The bare model: calling it directly bypasses the unit runners; the
  /// training and validation steps go through them.
  GPT& model() { return model_; }

 protected:
  // LanguageModelStages: the loss, validation and activation as the model runs.
  const tp::Parallel& stage_parallel() const override { return model_->tensor_parallel(); }
  int64_t stage_vocab() const override { return model_->options().vocab_size(); }
  int64_t stage_width() const override { return model_->options().n_embd(); }

 private:
  /// The model's forward with every block called through run_unit().
  torch::Tensor forward(const torch::Tensor& idx);

  GPT model_;
};

}  // namespace strata::recipes
