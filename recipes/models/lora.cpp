#include "strata/recipes/models/lora.h"

#include <cmath>

namespace strata::recipes {

LoRAImpl::LoRAImpl(int64_t in_features, int64_t out_features, int64_t rank, double alpha)
    : scale_(alpha / static_cast<double>(rank)) {
  TORCH_CHECK_VALUE(rank > 0 && alpha > 0, "LoRA needs rank > 0 and alpha > 0, got rank ", rank, ", alpha ",
                    alpha);
  a_ = register_parameter("A", torch::empty({rank, in_features}));
  b_ = register_parameter("B", torch::zeros({out_features, rank}));
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  torch::NoGradGuard no_grad;
  a_.uniform_(-bound, bound);
}

torch::Tensor LoRAImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(torch::nn::functional::linear(x, a_), b_) * scale_;
}

torch::Tensor LoRAImpl::column_parallel(const torch::Tensor& x, const tp::Parallel& tp) {
  // Under sequence parallelism x is this rank's tokens: A's gradient then
  // covers them only and is summed over the group (replicated()).
  const auto low = torch::nn::functional::linear(x, tp.replicated(a_));
  return tp.column(low, b_, {}) * scale_;
}

torch::Tensor LoRAImpl::row_parallel(const torch::Tensor& x, const tp::Parallel& tp) {
  const auto low = tp.row(x, a_, {});
  return torch::nn::functional::linear(low, tp.replicated(b_)) * scale_;
}

bool is_lora_parameter(const std::string& name) {
  return name.ends_with("_lora.A") || name.ends_with("_lora.B");
}

void init_lora_parameter(const std::string& name, const torch::Tensor& param, at::Generator generator) {
  torch::NoGradGuard no_grad;
  if (name.ends_with("_lora.B")) {
    param.zero_();
    return;
  }
  TORCH_CHECK(name.ends_with("_lora.A") && param.dim() == 2, "not a LoRA A matrix: ", name);
  const double bound = 1.0 / std::sqrt(static_cast<double>(param.size(1)));
  auto values = torch::empty(param.sizes(), param.options().device(torch::kCPU));
  values.uniform_(-bound, bound, generator);
  param.copy_(values);
}

std::map<std::string, torch::Tensor> merge_lora(const std::map<std::string, torch::Tensor>& by_strata_name,
                                                int64_t rank, double alpha) {
  std::map<std::string, torch::Tensor> out;
  bool adapters = false;
  for (const auto& [name, tensor] : by_strata_name) {
    if (is_lora_parameter(name)) {
      adapters = true;
    } else {
      out[name] = tensor;
    }
  }
  if (!adapters) return out;
  TORCH_CHECK_VALUE(rank > 0, "the parameters hold LoRA adapters, but the model has no LoRA rank "
                               "(and alpha) to merge them with");
  const double scale = alpha / static_cast<double>(rank);
  torch::NoGradGuard no_grad;
  for (const auto& [name, a] : by_strata_name) {
    if (!name.ends_with("_lora.A")) continue;
    const std::string stem = name.substr(0, name.size() - std::string("_lora.A").size());
    const auto b = by_strata_name.find(stem + "_lora.B");
    const auto w = out.find(stem + ".weight");
    TORCH_CHECK(b != by_strata_name.end() && w != out.end(), "merge_lora: ", name, " has no ", stem,
                "_lora.B or no ", stem, ".weight to merge into");
    // The copy is merged, never the model's own weight.
    w->second = w->second.detach().to(torch::kFloat32) +
                torch::matmul(b->second.detach().to(torch::kFloat32), a.detach().to(torch::kFloat32)) * scale;
  }
  return out;
}

}  // namespace strata::recipes
