#include "strata/strategies/fsdp/pre_backward.h"

#include <torch/csrc/autograd/custom_function.h>

namespace strata {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct PreBackwardHook : torch::CustomClassHolder {
  std::function<void()> fn;
};

/// Identity in forward. The engine runs its backward once the gradient
/// w.r.t. its output is complete (every use of the output has contributed),
/// and only then the nodes that produced the output.
class PreBackwardFunction : public torch::autograd::Function<PreBackwardFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<PreBackwardHook>& hook) {
    ctx->saved_data["hook"] = c10::IValue::make_capsule(hook);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    c10::static_intrusive_pointer_cast<PreBackwardHook>(ctx->saved_data.at("hook").toCapsule())->fn();
    return {grad_outputs[0], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor with_pre_backward_hook(const torch::Tensor& out, std::function<void()> hook) {
  TORCH_CHECK(out.requires_grad(), "with_pre_backward_hook: the tensor does not require grad, so "
              "no backward would reach the hook");
  auto holder = c10::make_intrusive<PreBackwardHook>();
  holder->fn = std::move(hook);
  return PreBackwardFunction::apply(out, holder);
}

}  // namespace strata
