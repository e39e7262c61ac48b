#include "strata/kernels/fused_adamw.h"

#include <cmath>

namespace strata {

namespace {

AdamWKernelFn pick_kernel(AdamWIsa isa) {
  if (isa == AdamWIsa::kAuto) isa = adamw_avx2_available() ? AdamWIsa::kAvx2 : AdamWIsa::kDefault;
  if (isa == AdamWIsa::kDefault) return &adamw_kernel_default;
  TORCH_CHECK(adamw_avx2_available(), "fused AdamW: the AVX2 kernel was asked for but this ",
              "build or CPU has no AVX2+FMA (kernel available: ", adamw_isa_name(AdamWIsa::kAuto), ")");
#ifdef STRATA_KERNELS_AVX2
  return &adamw_kernel_avx2;
#else
  return &adamw_kernel_default;  // unreachable: the check above failed
#endif
}

void check_buffer(const torch::Tensor& t, const char* name, int64_t numel, torch::ScalarType dtype) {
  TORCH_CHECK(t.defined(), "fused AdamW: ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() && !t.is_sparse(),
              "fused AdamW: ", name, " must be a contiguous ", dtype, " CPU tensor (got ",
              t.scalar_type(), " on ", t.device(), ", contiguous ", t.is_contiguous(), ")");
  TORCH_CHECK(t.numel() == numel, "fused AdamW: ", name, " has ", t.numel(),
              " elements but param has ", numel);
}

}  // namespace

AdamWStepOptions AdamWStepOptions::from(const torch::optim::AdamWOptions& options, int64_t step) {
  TORCH_CHECK_VALUE(!options.amsgrad(), "fused AdamW has no amsgrad (use torch::optim::AdamW)");
  return AdamWStepOptions(options.lr())
      .betas(options.betas())
      .eps(options.eps())
      .weight_decay(options.weight_decay())
      .step(step);
}

bool adamw_avx2_available() {
#ifdef STRATA_KERNELS_AVX2
  // Why a runtime check: the binary may run on an older x86-64 than it was built on.
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return available;
#else
  return false;
#endif
}

std::string adamw_isa_name(AdamWIsa isa) {
  if (isa == AdamWIsa::kAuto) isa = adamw_avx2_available() ? AdamWIsa::kAvx2 : AdamWIsa::kDefault;
  return isa == AdamWIsa::kAvx2 ? "avx2" : "default";
}

AdamWScalars adamw_scalars(const AdamWStepOptions& o) {
  const double beta1 = std::get<0>(o.betas());
  const double beta2 = std::get<1>(o.betas());
  TORCH_CHECK_VALUE(o.lr() >= 0 && o.eps() >= 0 && o.weight_decay() >= 0,
                    "fused AdamW: need lr, eps, weight_decay >= 0 (got lr ", o.lr(), ", eps ", o.eps(),
                    ", weight_decay ", o.weight_decay(), ")");
  TORCH_CHECK_VALUE(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
                    "fused AdamW: need betas in [0, 1) (got ", beta1, ", ", beta2, ")");
  TORCH_CHECK_VALUE(o.step() >= 1, "fused AdamW: step counts from 1 (got ", o.step(), ")");
  // Computed in double and rounded once to fp32, as torch::optim::AdamW's
  // Scalars are when its fp32 kernels read them.
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(o.step()));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(o.step()));
  AdamWScalars s{};
  s.decay = static_cast<float>(1 - o.lr() * o.weight_decay());
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(o.eps());
  s.neg_step_size = static_cast<float>(-(o.lr() / bias_correction1));
  return s;
}

void fused_adamw_step_raw(const AdamWScalars& scalars, float* param, const float* grad, float* exp_avg,
                          float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n, AdamWIsa isa) {
  const AdamWKernelFn kernel = pick_kernel(isa);
  // Chunks are disjoint element ranges: no synchronization beyond
  // parallel_for's own join.
  at::parallel_for(0, n, kAdamWGrain, [&](int64_t begin, int64_t end) {
    kernel(scalars, param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin,
           param_bf16 == nullptr ? nullptr : param_bf16 + begin, end - begin);
  });
}

void fused_adamw_step_range(const torch::Tensor& param, const torch::Tensor& grad,
                            const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                            const AdamWStepOptions& options, int64_t begin, int64_t end,
                            const torch::Tensor& param_bf16, AdamWIsa isa) {
  TORCH_CHECK(param.defined(), "fused AdamW: param is undefined");
  const int64_t n = param.numel();
  check_buffer(param, "param", n, torch::kFloat);
  check_buffer(grad, "grad", n, torch::kFloat);
  check_buffer(exp_avg, "exp_avg", n, torch::kFloat);
  check_buffer(exp_avg_sq, "exp_avg_sq", n, torch::kFloat);
  if (param_bf16.defined()) check_buffer(param_bf16, "param_bf16", n, torch::kBFloat16);
  TORCH_CHECK_VALUE(0 <= begin && begin <= end && end <= n, "fused AdamW: range [", begin, ", ", end,
                    ") is not within the ", n, " elements");
  const auto scalars = adamw_scalars(options);
  fused_adamw_step_raw(scalars, param.data_ptr<float>() + begin, grad.data_ptr<float>() + begin,
                       exp_avg.data_ptr<float>() + begin, exp_avg_sq.data_ptr<float>() + begin,
                       param_bf16.defined() ? param_bf16.data_ptr<c10::BFloat16>() + begin : nullptr,
                       end - begin, isa);
}

void fused_adamw_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                      const torch::Tensor& exp_avg_sq, const AdamWStepOptions& options,
                      const torch::Tensor& param_bf16, AdamWIsa isa) {
  TORCH_CHECK(param.defined(), "fused AdamW: param is undefined");
  fused_adamw_step_range(param, grad, exp_avg, exp_avg_sq, options, 0, param.numel(), param_bf16, isa);
}

}  // namespace strata
