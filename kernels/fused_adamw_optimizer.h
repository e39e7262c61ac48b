#pragma once
// FusedAdamW: torch::optim::AdamW whose step() runs the fused kernel
// (kernels/fused_adamw.h) on each parameter: one pass over memory instead of
// ~ten tensor ops. Everything else is AdamW's own: param groups, AdamWOptions
// per group (the Trainer's per-group lr), AdamWParamState per parameter
// (exp_avg, exp_avg_sq, step) and save()/load(), so checkpoints move freely
// between the two classes and strategies that hand the optimizer 1-D views of
// a flat shard (oss/sdp/fsdp) work unchanged.
//
// Parameters with an undefined grad are skipped, as AdamW does. A parameter
// the kernel cannot take (not a contiguous fp32 CPU tensor, a sparse or
// non-matching grad, or a group with amsgrad) is stepped with AdamW's own
// tensor-op math instead (the same arithmetic, slower).
//
// Example:
//   strata::FusedAdamW opt(module->parameters(), torch::optim::AdamWOptions(1e-3));
//   loss.backward(); opt.step();
#include <torch/torch.h>

#include <vector>

namespace strata {

class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      torch::optim::AdamWOptions defaults = {})
      : AdamW(std::move(param_groups), std::move(defaults)) {}
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {})
      : AdamW(std::move(params), std::move(defaults)) {}

  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Parameters stepped by the fused kernel / by the fallback so far (tests, reports).
  int64_t fused_steps() const { return fused_steps_; }
  int64_t fallback_steps() const { return fallback_steps_; }

 private:
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p, const torch::optim::AdamWOptions& options);

  int64_t fused_steps_ = 0;
  int64_t fallback_steps_ = 0;
};

}  // namespace strata
