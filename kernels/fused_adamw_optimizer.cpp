#include "strata/kernels/fused_adamw_optimizer.h"

#include "strata/core/optim_state_key.h"
#include "strata/kernels/fused_adamw.h"

#include <cmath>
#include <map>
#include <utility>

namespace strata {

namespace {

bool fp32_dense(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat &&
         t.layout() == torch::kStrided && t.is_contiguous();
}

bool fusable(const torch::Tensor& p, const torch::Tensor& grad, const torch::optim::AdamWOptions& options) {
  return !options.amsgrad() && fp32_dense(p) && fp32_dense(grad) && grad.numel() == p.numel();
}

/// torch::optim::AdamW::step's body for one parameter (LibTorch 1.13), for
/// what the kernel cannot take. `state.step()` is already incremented.
void reference_step(torch::Tensor& p, const torch::Tensor& grad, torch::optim::AdamWParamState& state,
                    const torch::optim::AdamWOptions& options) {
  auto& exp_avg = state.exp_avg();
  auto& exp_avg_sq = state.exp_avg_sq();
  auto& max_exp_avg_sq = state.max_exp_avg_sq();
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, state.step());
  const double bias_correction2 = 1 - std::pow(beta2, state.step());
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  torch::Tensor denom;
  if (options.amsgrad()) {
    torch::max_out(max_exp_avg_sq, exp_avg_sq, max_exp_avg_sq);
    denom = (max_exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  } else {
    denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  }
  p.addcdiv_(exp_avg, denom, -options.lr() / bias_correction1);
}

}  // namespace

torch::optim::AdamWParamState& FusedAdamW::state_of(const torch::Tensor& p,
                                                    const torch::optim::AdamWOptions& options) {
  // The key and the lazily created zero state are AdamW's, so save()/load()
  // and optimizer_state_bytes() see the same state either class made.
  void* const key = optim_state_key(p);
  auto it = state_.find(key);
  if (it == state_.end()) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    if (options.amsgrad()) {
      state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    }
    it = state_.emplace(key, std::move(state)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) step_group(group);
  return loss;
}

namespace {

/// The parameters of one at::_fused_adamw_ call: ATen's kernel takes a group
/// as lists on one device, with each parameter's step count as a float tensor
/// it reads (PyTorch's AdamW increments it before the call).
struct AtenBatch {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<float> steps;

  void add(const torch::Tensor& p, const torch::Tensor& grad, torch::optim::AdamWParamState& state) {
    params.push_back(p);
    grads.push_back(grad);
    exp_avgs.push_back(state.exp_avg());
    exp_avg_sqs.push_back(state.exp_avg_sq());
    steps.push_back(static_cast<float>(state.step()));
  }

  void run(const torch::optim::AdamWOptions& options) const {
    if (params.empty()) return;
    // One tensor of step counts, copied to the device once and split into
    // 0-d views: one small copy per group, where a tensor per parameter would
    // cost a launch (on CUDA) each. From pinned memory, asynchronously: a
    // pageable copy would make the host wait for the GPU here (the caching
    // host allocator keeps the pinned block until the copy has run).
    auto host_steps = torch::tensor(steps, torch::kFloat);
    const auto device = params.front().device();
    const auto step_tensors =
        (device.is_cpu() ? host_steps : host_steps.pin_memory().to(device, /*non_blocking=*/true)).unbind(0);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_tensors, options.lr(),
                      std::get<0>(options.betas()), std::get<1>(options.betas()), options.weight_decay(),
                      options.eps(), /*amsgrad=*/false, /*maximize=*/false);
  }
};

/// A CUDA parameter ATen's fused CUDA kernel takes (one multi-tensor launch
/// for the group instead of ~ten per parameter): strata's own kernel is CPU code.
bool cuda_fusable(const torch::Tensor& p, const torch::Tensor& grad, torch::optim::AdamWParamState& state,
                  const torch::optim::AdamWOptions& options) {
  const auto same = [&](const torch::Tensor& t) {
    return t.defined() && t.device() == p.device() && t.scalar_type() == p.scalar_type() &&
           t.layout() == torch::kStrided && t.is_contiguous() && t.numel() == p.numel();
  };
  return !options.amsgrad() && p.is_cuda() && at::isFloatingType(p.scalar_type()) && p.is_contiguous() &&
         same(grad) && same(state.exp_avg()) && same(state.exp_avg_sq());
}

}  // namespace

void FusedAdamW::step_group(torch::optim::OptimizerParamGroup& group) {
  auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
  AtenBatch cpu_batch;
  // ATen's fused kernel takes one device and dtype per call; PyTorch groups
  // its lists the same way (_group_tensors_by_device_and_dtype).
  std::map<std::pair<c10::DeviceIndex, c10::ScalarType>, AtenBatch> cuda_batches;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    const auto& grad = p.grad();
    TORCH_CHECK(!grad.is_sparse(), "AdamW does not support sparse gradients");
    auto& state = state_of(p, options);
    state.step(state.step() + 1);
    const bool kernel_takes = fusable(p, grad, options) && fp32_dense(state.exp_avg()) &&
                              fp32_dense(state.exp_avg_sq()) && state.exp_avg().numel() == p.numel() &&
                              state.exp_avg_sq().numel() == p.numel();
    if (cuda_fusable(p, grad, state, options)) {
      cuda_batches[{p.device().index(), p.scalar_type()}].add(p, grad, state);
      ++fused_steps_;
    } else if (!kernel_takes) {
      if (options.weight_decay() != 0) p.mul_(1 - options.lr() * options.weight_decay());
      reference_step(p, grad, state, options);
      ++fallback_steps_;
    } else if (kernel_ == FusedAdamWKernel::kStrata) {
      fused_adamw_step(p, grad, state.exp_avg(), state.exp_avg_sq(), AdamWStepOptions::from(options, state.step()));
      ++fused_steps_;
    } else {
      cpu_batch.add(p, grad, state);
      ++fused_steps_;
    }
  }
  cpu_batch.run(options);
  for (const auto& [device_dtype, batch] : cuda_batches) batch.run(options);
}

std::string fused_adamw_kernel_name(FusedAdamWKernel kernel) {
  return kernel == FusedAdamWKernel::kAten ? "aten" : "strata";
}

std::vector<std::string> fused_adamw_kernel_names() { return {"strata", "aten"}; }

FusedAdamWKernel parse_fused_adamw_kernel(const std::string& name) {
  if (name == "strata") return FusedAdamWKernel::kStrata;
  TORCH_CHECK_VALUE(name == "aten", "unknown AdamW kernel '", name, "'; available: strata, aten");
  return FusedAdamWKernel::kAten;
}

}  // namespace strata
