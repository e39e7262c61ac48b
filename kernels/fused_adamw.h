#pragma once
// Fused AdamW step over flat fp32 buffers: one pass that reads param, grad,
// exp_avg and exp_avg_sq once and writes param, exp_avg and exp_avg_sq once
// (optionally also a bf16 copy of the updated param), where
// torch::optim::AdamW runs ~ten whole-tensor kernels. Same math and the same
// fp32 roundings as LibTorch 1.13's AdamW (kernels/fused_adamw_kernel.h).
// Vectorised (AVX2+FMA where the CPU has it, else ATen's portable vectors)
// and parallel over cache-sized chunks with at::parallel_for.
//
// No optimizer objects here: a streamed (offloaded) step calls
// fused_adamw_step_range chunk by chunk on its own buffers.
//
// Example:
//   auto opts = strata::AdamWStepOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1).step(t);
//   strata::fused_adamw_step(param, grad, exp_avg, exp_avg_sq, opts);
#include "strata/kernels/adamw_scalars.h"

#include <torch/torch.h>

#include <string>
#include <tuple>

namespace strata {

/// torch::optim::AdamWOptions (amsgrad excluded) plus the step count.
struct AdamWStepOptions {
  explicit AdamWStepOptions(double lr = 1e-3) : lr_(lr) {}
  /// The same values as `options` (amsgrad must be off) at step `step`.
  static AdamWStepOptions from(const torch::optim::AdamWOptions& options, int64_t step);
  TORCH_ARG(double, lr);
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 1e-2;
  /// The step being taken, counted from 1 (AdamWParamState::step after its
  /// increment); sets the bias corrections.
  TORCH_ARG(int64_t, step) = 1;
};

/// Which kernel fused_adamw_* runs.
enum class AdamWIsa {
  kAuto,     ///< AVX2+FMA when this build and CPU have it, else kDefault
  kDefault,  ///< ATen's portable vector type (any CPU)
  kAvx2,     ///< x86-64 AVX2+FMA; TORCH_CHECK fails where unavailable
};

/// True when this build has the AVX2 kernel and this CPU can run it.
bool adamw_avx2_available();
/// "avx2" or "default": what kAuto picks here.
std::string adamw_isa_name(AdamWIsa isa = AdamWIsa::kAuto);

/// The fp32 constants of one step (validates the options).
AdamWScalars adamw_scalars(const AdamWStepOptions& options);

/// One AdamW step over all of `param` (in place, as are exp_avg and
/// exp_avg_sq). All four: contiguous fp32 CPU tensors with the same number of
/// elements (shapes may differ, e.g. 1-D views of a flat shard).
/// `param_bf16`, if defined: a contiguous bf16 tensor of as many elements that
/// receives the updated param.
void fused_adamw_step(const torch::Tensor& param, const torch::Tensor& grad, const torch::Tensor& exp_avg,
                      const torch::Tensor& exp_avg_sq, const AdamWStepOptions& options,
                      const torch::Tensor& param_bf16 = {}, AdamWIsa isa = AdamWIsa::kAuto);

/// The same step on the flat elements [begin, end) only; the rest is untouched.
/// Calling it over consecutive ranges equals one fused_adamw_step call.
void fused_adamw_step_range(const torch::Tensor& param, const torch::Tensor& grad,
                            const torch::Tensor& exp_avg, const torch::Tensor& exp_avg_sq,
                            const AdamWStepOptions& options, int64_t begin, int64_t end,
                            const torch::Tensor& param_bf16 = {}, AdamWIsa isa = AdamWIsa::kAuto);

/// The raw kernel over n contiguous elements, parallel over chunks of
/// kAdamWGrain elements (at::parallel_for). `param_bf16` may be null.
void fused_adamw_step_raw(const AdamWScalars& scalars, float* param, const float* grad, float* exp_avg,
                          float* exp_avg_sq, c10::BFloat16* param_bf16, int64_t n,
                          AdamWIsa isa = AdamWIsa::kAuto);

/// Elements per parallel chunk: 4 fp32 streams of 32 Ki elements = 512 KiB,
/// within a core's L2, and enough work (~10 us) to amortise a task.
constexpr int64_t kAdamWGrain = 32 * 1024;

}  // namespace strata
