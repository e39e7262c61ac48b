#include "strata/core/deferred_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <unordered_set>

namespace strata {

void replace_data(const torch::Tensor& param, const torch::Tensor& data) {
  TORCH_CHECK(param.defined() && data.defined(), "replace_data: both tensors must be defined");
  TORCH_CHECK(param.scalar_type() == data.scalar_type(), "replace_data: the parameter is ",
              param.scalar_type(), " but the new data is ", data.scalar_type());
  if (!param.is_meta() && !data.is_meta()) {
    param.set_data(data);
    return;
  }
  TORCH_CHECK(param.is_leaf(), "replace_data: only leaf tensors (parameters) can change device");
  if (param.device() != data.device()) {
    // What set_data does when the device changes: a gradient and an
    // AccumulateGrad node recorded for the old device no longer fit.
    if (param.grad().defined()) param.mutable_grad() = torch::Tensor();
    if (auto* meta = torch::autograd::impl::get_autograd_meta(param)) {
      std::lock_guard<std::mutex> lock(meta->mutex_);
      meta->grad_accumulator_.reset();
    }
  }
  // set_data minus its "compatible tensor type" check, which rejects meta.
  param.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

void defer_parameters(torch::nn::Module& module) {
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (is_deferred(p)) continue;
    replace_data(p, torch::empty(p.sizes(), p.options().device(torch::kMeta).requires_grad(false)));
  }
}

bool has_deferred_parameters(torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (is_deferred(p)) return true;
  }
  return false;
}

void move_materialized(torch::nn::Module& module, const torch::Device& device) {
  if (!has_deferred_parameters(module)) {
    module.to(device);  // the module's own to(): a subclass may override it
    return;
  }
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (!is_deferred(p) && p.device() != device) p.set_data(p.to(device));
  }
  for (auto& b : module.buffers(/*recurse=*/true)) {
    if (b.device() != device) b.set_data(b.to(device));
  }
}

void materialize_parameters(TrainingModule& module, const torch::Device& device,
                            const std::function<bool(const std::string&, const torch::Tensor&)>& which) {
  torch::NoGradGuard no_grad;
  std::unordered_set<const void*> done;
  for (const auto& item : module.module().named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    if (!is_deferred(p) || (which && !which(item.key(), p))) continue;
    if (!done.insert(p.unsafeGetTensorImpl()).second) continue;
    replace_data(p, torch::empty(p.sizes(), p.options().device(device).requires_grad(false)));
    module.init_parameter(item.key(), p);
  }
}

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  // FNV-1a over the name (stable across platforms and runs, unlike
  // std::hash), then splitmix64 over seed and hash.
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  uint64_t z = seed ^ (h + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

at::Generator parameter_generator(uint64_t seed, const std::string& name) {
  return at::detail::createCPUGenerator(parameter_seed(seed, name));
}

void normal_init(const torch::Tensor& param, double mean, double stddev, at::Generator generator) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(!is_deferred(param), "normal_init: the parameter has no memory yet (meta device)");
  if (param.device().is_cpu() && param.is_contiguous()) {
    // In place: CPU normal_ draws the same values for any contiguous tensor
    // of the same size, a standalone parameter or a view of a flat buffer.
    param.normal_(mean, stddev, generator);
    return;
  }
  auto values = torch::empty(param.sizes(), param.options().device(torch::kCPU).requires_grad(false));
  values.normal_(mean, stddev, generator);
  param.copy_(values);
}

}  // namespace strata
