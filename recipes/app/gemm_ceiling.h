#pragma once
// The GEMM-bound ceiling of a model's training step on this CPU (issue 35): the
// tokens/s a rank would reach if the whole step ran at the rate this machine
// multiplies the model's own matrices, FLOPs per token (6N + 12·L·H·Q·T, the
// attention's included) over that rate. A job's share of it says how much of
// a step is spent outside its matrix products: element-wise ops, casts,
// attention's own kernel, the optimizer, waiting for collectives.
//
// The rate is measured on the step's own shapes, each Linear's forward and
// its backward's two products (input and weight gradients), the head's
// included, in the precision's compute dtype: their FLOPs over the sum of
// each one's best time. Cached like the MFU peak (recipes/app/peak_flops.h),
// keyed by CPU, LibTorch, dtype, threads and the shapes: the launcher
// measures before any rank starts, the ranks read it.
#include "strata/recipes/app/peak_flops.h"
#include "strata/recipes/models/spec.h"

#include <cstdint>
#include <string>
#include <vector>

namespace strata::recipes {

/// FLOP/s of `shapes` in `dtype` ("fp32", "bf16", "fp16") with `threads`
/// threads: their FLOPs over the sum of each one's best time; cached in
/// `cache_path` ("" = not cached) as cpu_peak_flops caches.
PeakFlops cpu_gemm_rate(const std::vector<GemmShape>& shapes, int threads, const std::string& dtype,
                        const std::string& cache_path);

/// One rank's ceiling in tokens/s: cpu_gemm_rate of the model's step
/// (ModelConfig::step_gemms) at this micro-batch over its FLOPs per token
/// (`flops_per_token`, the model's own).
double gemm_ceiling_tokens_per_s(const ModelConfig& model, int64_t micro_batch, double flops_per_token,
                                 const std::string& precision, int threads, const std::string& cache_path);

}  // namespace strata::recipes
