#pragma once
// FusedAdamW: torch::optim::AdamW whose step() runs the fused kernel
// (kernels/fused_adamw.h) on each parameter: one pass over memory instead of
// ~ten tensor ops. Everything else is AdamW's own: param groups, AdamWOptions
// per group (the Trainer's per-group lr), AdamWParamState per parameter
// (exp_avg, exp_avg_sq, step) and save()/load(), so checkpoints move freely
// between the two classes and strategies that hand the optimizer 1-D views of
// a flat shard (oss/sdp/fsdp) work unchanged.
//
// Two kernels (FusedAdamWKernel): strata's own (kernels/fused_adamw.h, the
// default) or ATen's fused CPU AdamW (at::_fused_adamw_, what PyTorch's
// AdamW(fused=True) runs), one call per group. Both keep AdamW's state, so a
// checkpoint moves between them too.
//
// CUDA parameters always take ATen's fused CUDA kernel (one multi-tensor
// launch per group, what PyTorch's AdamW(fused=True) runs on a GPU): strata's
// kernel is CPU code.
//
// Parameters with an undefined grad are skipped, as AdamW does. A parameter
// no kernel can take (not contiguous, a CPU tensor not in fp32, a sparse or
// non-matching grad, or a group with amsgrad) is stepped with AdamW's own
// tensor-op math instead (the same arithmetic, slower).
//
// Example:
//   strata::FusedAdamW opt(module->parameters(), torch::optim::AdamWOptions(1e-3));
//   loss.backward(); opt.step();
#include <torch/torch.h>

#include <string>
#include <vector>

namespace strata {

/// Which fused step FusedAdamW runs. kStrata: kernels/fused_adamw.h, the
/// default (10% faster than ATen's on 2 threads, equal on 1; README "Kernels:
/// strata's against ATen's"); kAten: at::_fused_adamw_.
enum class FusedAdamWKernel { kStrata, kAten };

/// "strata" or "aten" (the --adamw-kernel values), and the inverse; parse
/// throws c10::ValueError naming the value and the choices.
std::string fused_adamw_kernel_name(FusedAdamWKernel kernel);
FusedAdamWKernel parse_fused_adamw_kernel(const std::string& name);
std::vector<std::string> fused_adamw_kernel_names();

class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      torch::optim::AdamWOptions defaults = {},
                      FusedAdamWKernel kernel = FusedAdamWKernel::kStrata)
      : AdamW(std::move(param_groups), std::move(defaults)), kernel_(kernel) {}
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {},
                      FusedAdamWKernel kernel = FusedAdamWKernel::kStrata)
      : AdamW(std::move(params), std::move(defaults)), kernel_(kernel) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Parameters stepped by the fused kernel / by the fallback so far (tests, reports).
  int64_t fused_steps() const { return fused_steps_; }
  int64_t fallback_steps() const { return fallback_steps_; }
  FusedAdamWKernel kernel() const { return kernel_; }

 private:
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p, const torch::optim::AdamWOptions& options);
  /// One group's parameters through the chosen kernel or the fallback.
  void step_group(torch::optim::OptimizerParamGroup& group);

  FusedAdamWKernel kernel_;

  int64_t fused_steps_ = 0;
  int64_t fallback_steps_ = 0;
};

}  // namespace strata
