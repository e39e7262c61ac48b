#include "strata/recipes/app/gemm_ceiling.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace strata::recipes {

namespace {

/// The best of a few [m, k] x [k, n] products, seconds.
double best_seconds(int64_t m, int64_t k, int64_t n, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(/*seed_in=*/0);  // not the default one (dropout's)
  const auto a = torch::randn({m, k}, gen).to(dtype), b = torch::randn({k, n}, gen).to(dtype);
  auto out = torch::empty({m, n}, torch::TensorOptions(dtype));
  torch::mm_out(out, a, b);  // warm-up
  double best = std::numeric_limits<double>::infinity();
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    torch::mm_out(out, a, b);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (std::chrono::duration<double>(t1 - begin).count() > 1.0) break;
  }
  return std::max(best, 1e-9);
}

}  // namespace

PeakFlops cpu_gemm_rate(const std::vector<GemmShape>& shapes, int threads, const std::string& dtype,
                        const std::string& cache_path) {
  TORCH_CHECK_VALUE(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "cpu_gemm_rate: unknown dtype '", dtype,
                    "'; allowed: fp32, bf16, fp16");
  std::ostringstream key;
  key << peak_cache_key(threads, dtype) << " | gemms";
  for (const auto& s : shapes) key << " " << s.count << "*" << s.m << "x" << s.k << "x" << s.n;
  const auto type = dtype == "fp32" ? torch::kFloat32 : dtype == "bf16" ? torch::kBFloat16 : torch::kHalf;
  return cached_rate(key.str(), cache_path, threads, [&shapes, type] {
    double flops = 0.0, seconds = 0.0;
    for (const auto& s : shapes) {
      flops += s.flops();
      seconds += double(s.count) * best_seconds(s.m, s.k, s.n, type);  // each repeat costs alike
    }
    return flops / std::max(seconds, 1e-9);
  });
}

double gemm_ceiling_tokens_per_s(const ModelConfig& model, int64_t micro_batch, double flops_per_token,
                                 const std::string& precision, int threads, const std::string& cache_path) {
  TORCH_CHECK_VALUE(flops_per_token > 0.0, "gemm ceiling: FLOPs per token must be > 0, got ", flops_per_token);
  const auto shapes = model.step_gemms(micro_batch * model.shape().block_size);
  return cpu_gemm_rate(shapes, threads, peak_dtype(precision), cache_path).flops / flops_per_token;
}

}  // namespace strata::recipes
