#pragma once
// LoRA (Hu et al., 2021; the layout of Hugging Face PEFT's LoraConfig) for
// any family's Linear layers: a targeted Linear computes W x + b + (alpha / r) · B (A x),
// with A [r, in] drawn like a Linear's weight (uniform ±1/sqrt(in)) and B
// [out, r] zero, so training starts from the base model exactly. With LoRA on,
// every other parameter is frozen (requires_grad false): strategies give
// frozen parameters no gradient, no optimizer state and no communication.
// Export merges the adapters into the base weights (merge_lora), so the file
// loads into the plain model (a family says which Linears it targets and
// counts their adapters: models/gpt/gpt.h).
#include "strata/strategies/tp/parallel.h"

#include <torch/torch.h>

#include <map>
#include <string>

namespace strata::recipes {

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

/// The init of an adapter parameter (as a Linear's weight), in place: A uniform ±1/sqrt(in)
/// from `generator`, B zero.
void init_lora_parameter(const std::string& name, const torch::Tensor& param, at::Generator generator);

/// The parameters with every adapter "<x>_lora.A/B" merged into its
/// Linear's weight "<x>.weight" (W + alpha / rank · B A) and the adapter
/// parameters dropped; unchanged without adapters (adapters with `rank` 0
/// are an error: no scale). `by_name` must hold full (not sharded) tensors.
std::map<std::string, torch::Tensor> merge_lora(const std::map<std::string, torch::Tensor>& by_name, int64_t rank,
                                                double alpha);

}  // namespace strata::recipes
