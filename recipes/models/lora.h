#pragma once
// LoRA (Hu et al., 2021; the layout of Hugging Face PEFT's LoraConfig) for
// the GPT recipe: a targeted Linear computes W x + b + (alpha / r) · B (A x),
// with A [r, in] drawn like a Linear's weight (uniform ±1/sqrt(in)) and B
// [out, r] zero, so training starts from the base model exactly. With LoRA on,
// every other parameter is frozen (requires_grad false): strategies give
// frozen parameters no gradient, no optimizer state and no communication.
// Export merges the adapters into the base weights (merge_lora), so the file
// loads into a plain GPT, here or in nanoGPT.
#include "strata/strategies/tp/parallel.h"

#include <torch/torch.h>

#include <map>
#include <string>

namespace strata::recipes {

struct GPTOptions;

/// Which Linear layers get adapters: attn (attn.c_attn, attn.c_proj), mlp
/// (c_fc, c_proj), or both.
struct LoraTargets {
  bool attn = false;
  bool mlp = false;
};

/// "attn", "mlp", "attn,mlp" (either order); anything else is an error
/// naming the value and what is allowed.
LoraTargets parse_lora_targets(const std::string& text);

/// The adapter of one Linear: forward(x) = scale · (x Aᵀ) Bᵀ, added to the
/// Linear's output by its owner. Parameters "A" and "B".
class LoRAImpl : public torch::nn::Module {
 public:
  LoRAImpl(int64_t in_features, int64_t out_features, int64_t rank, double alpha);
  torch::Tensor forward(const torch::Tensor& x);

  /// Beside a column-parallel Linear (tensor parallelism): B holds this
  /// rank's output features (its rows), A is whole. A's product is taken
  /// before the tensor-parallel input mapping, so only its r features cross
  /// the group, and its gradient is the same on every rank. `x` as the
  /// Linear gets it; the result is this rank's output features.
  torch::Tensor column_parallel(const torch::Tensor& x, const tp::Parallel& tp);
  /// Beside a row-parallel Linear: A holds this rank's input features (its
  /// columns), B is whole. A's partial products are summed over the group
  /// (r features), then B applies: the result is the Linear's whole output.
  torch::Tensor row_parallel(const torch::Tensor& x, const tp::Parallel& tp);

 private:
  torch::Tensor a_, b_;
  double scale_;
};
TORCH_MODULE(LoRA);

/// Adapter parameters are named "<linear>_lora.A" / "<linear>_lora.B".
bool is_lora_parameter(const std::string& name);

/// The adapter parameters a GPT with these options has (0 without LoRA); with
/// `tp_size` > 1, those of one tensor-parallel rank.
int64_t count_lora_parameters(const GPTOptions& options, int tp_size = 1);

/// GPT-2-style init of an adapter parameter, in place: A uniform ±1/sqrt(in)
/// from `generator`, B zero.
void init_lora_parameter(const std::string& name, const torch::Tensor& param, at::Generator generator);

/// The parameters with every adapter merged into its Linear's weight
/// (W + scale · B A) and the adapter parameters dropped; unchanged without
/// adapters (adapters with options.lora_rank() 0 are an error: no scale).
/// `by_strata_name` must hold full (not sharded) tensors.
std::map<std::string, torch::Tensor> merge_lora(const std::map<std::string, torch::Tensor>& by_strata_name,
                                                const GPTOptions& options);

}  // namespace strata::recipes
