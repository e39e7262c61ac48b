#include "strata/callbacks/throughput.h"

#include "strata/core/cuda_support.h"
#include "strata/trainer/trainer.h"

#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace strata {
namespace {

/// Best seconds of one n×n product over up to `repeats` products, stopping
/// early once `budget_s` has been spent (after at least one timed product).
double best_matmul_seconds(int64_t n, int repeats, double budget_s, torch::Dtype dtype = torch::kFloat32) {
  torch::NoGradGuard no_grad;
  // Host buffers wrapped with from_blob: nothing goes through the CPU
  // allocator, so a MemoryTracker's peak (the memory benchmarks' numbers)
  // does not see this probe.
  // float-sized elements: room for any dtype of at most 4 bytes.
  std::vector<float> a_data(static_cast<size_t>(n * n)), b_data(a_data.size()), c_data(a_data.size());
  // Its own generator: the probe must not move the default one, from which
  // training draws its dropout masks (a resume restores that one's state).
  auto gen = at::detail::createCPUGenerator(/*seed_in=*/0);
  const auto a = torch::from_blob(a_data.data(), {n, n}, dtype).normal_(0.0, 1.0, gen);
  const auto b = torch::from_blob(b_data.data(), {n, n}, dtype).normal_(0.0, 1.0, gen);
  auto c = torch::from_blob(c_data.data(), {n, n}, dtype);
  torch::mm_out(c, a, b);  // warm-up: thread pool start, BLAS buffers
  using Clock = std::chrono::steady_clock;
  const auto begin = Clock::now();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    torch::mm_out(c, a, b);
    const auto t1 = Clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (std::chrono::duration<double>(t1 - begin).count() > budget_s) break;
  }
  return std::max(best, 1e-9);
}

}  // namespace

double measure_matmul_peak_flops(int64_t n, int repeats, torch::Dtype dtype) {
  TORCH_CHECK(n >= 1 && repeats >= 1, "measure_matmul_peak_flops: need n >= 1 and repeats >= 1, got n=",
              n, ", repeats=", repeats);
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "measure_matmul_peak_flops: dtype must be float32, bfloat16 or float16, got ", dtype);
  const double flops = 2.0 * double(n) * double(n) * double(n);
  return flops / best_matmul_seconds(n, repeats, /*budget_s=*/2.0, dtype);
}

double measure_cuda_matmul_peak_flops(int index, int64_t n, int repeats, torch::Dtype dtype) {
  TORCH_CHECK(n >= 1 && repeats >= 1, "measure_cuda_matmul_peak_flops: need n >= 1 and repeats >= 1, got n=",
              n, ", repeats=", repeats);
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kHalf,
              "measure_cuda_matmul_peak_flops: dtype must be float32, bfloat16 or float16, got ", dtype);
  torch::NoGradGuard no_grad;
  double best = std::numeric_limits<double>::infinity();
  {
    const auto options = torch::TensorOptions(dtype).device(torch::kCUDA, index);
    // Drawn on the host from its own generator: the device's default one
    // (dropout on CUDA) must not move.
    auto gen = at::detail::createCPUGenerator(/*seed_in=*/0);
    const auto a = torch::randn({n, n}, gen, torch::kFloat32).to(options);
    const auto b = torch::randn({n, n}, gen, torch::kFloat32).to(options);
    auto c = torch::empty({n, n}, options);
    torch::mm_out(c, a, b);  // warm-up: cuBLAS handle and workspace
    for (int i = 0; i < repeats; ++i) {
      // Kernels are asynchronous: time from one synchronization to the next.
      torch::cuda::synchronize(index);
      const auto t0 = std::chrono::steady_clock::now();
      torch::mm_out(c, a, b);
      torch::cuda::synchronize(index);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  // The probe's buffers are gone; keep them out of the run's memory peak.
  reset_cuda_peak_allocated_bytes(index);
  return 2.0 * double(n) * double(n) * double(n) / std::max(best, 1e-9);
}

BlasCheck check_blas_speed(double min_gflops) {
  TORCH_CHECK(min_gflops >= 0.0, "check_blas_speed: min_gflops must be >= 0, got ", min_gflops);
  // 384³·2 = 0.11 GFLOP: ~1 ms per product with the wheel's MKL on one core here.
  constexpr int64_t n = 384;
  const double seconds = best_matmul_seconds(n, 5, 0.15);
  BlasCheck check;
  check.gflops = 2.0 * double(n) * double(n) * double(n) / seconds / 1e9;
  check.slow = check.gflops < min_gflops;
  char buf[256];
  if (check.slow) {
    std::snprintf(buf, sizeof(buf),
                  "WARNING: matrix products run at %.1f GFLOP/s (expected >= %.1f): LibTorch's "
                  "BLAS is starved; check that other jobs, OMP_NUM_THREADS or --threads-per-rank "
                  "times ranks do not oversubscribe the cores",
                  check.gflops, min_gflops);
  } else {
    std::snprintf(buf, sizeof(buf), "matrix products run at %.1f GFLOP/s (threshold %.1f)",
                  check.gflops, min_gflops);
  }
  check.message = buf;
  return check;
}

Throughput::Throughput(ThroughputOptions options) : options_(std::move(options)) {
  TORCH_CHECK(options_.window() >= 1, "Throughput: window must be >= 1, got ", options_.window());
  TORCH_CHECK(options_.peak_flops() >= 0.0 && std::isfinite(options_.peak_flops()),
              "Throughput: peak_flops must be finite and >= 0 (0 = measure), got ", options_.peak_flops());
  TORCH_CHECK(options_.peak_matmul_size() >= 1, "Throughput: peak_matmul_size must be >= 1, got ",
              options_.peak_matmul_size());
  peak_flops_ = options_.peak_flops();
}

void Throughput::on_fit_start(Trainer& trainer, TrainingModule&) {
  // Measured once per callback (a second fit() reuses it). Every rank measures
  // its own peak: ranks sharing a machine share its cores, which is the point.
  if (peak_flops_ > 0.0) return;
  const torch::Device& device = trainer.strategy().device();
  peak_flops_ = device.is_cuda()
                    ? measure_cuda_matmul_peak_flops(device.index(), 4096, 10, options_.peak_dtype())
                    : measure_matmul_peak_flops(options_.peak_matmul_size(), 5, options_.peak_dtype());
}

void Throughput::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                    const StepMetrics& metrics) {
  for (const auto& [key, value] : update(metrics, trainer.strategy().job_size(), module.flops_per_token()))
    trainer.log(key, value);
}

LogRow Throughput::update(const StepMetrics& metrics, int world_size, double flops_per_token) {
  TORCH_CHECK(world_size >= 1, "Throughput: world_size must be >= 1, got ", world_size);
  if (++steps_ == 1) return {};  // warm-up step
  window_.push_back({metrics.tokens, metrics.samples, metrics.step_seconds});
  if (static_cast<int64_t>(window_.size()) > options_.window()) window_.pop_front();
  // Re-summed each step (the window is small) so no rounding drift accumulates.
  window_tokens_ = window_samples_ = 0;
  window_seconds_ = 0.0;
  for (const Sample& s : window_) {
    window_tokens_ += s.tokens;
    window_samples_ += s.samples;
    window_seconds_ += s.seconds;
  }
  total_tokens_ += metrics.tokens;
  total_seconds_ += metrics.step_seconds;

  LogRow row{{"tokens_per_s", tokens_per_s()}, {"samples_per_s", samples_per_s()}};
  mfu_ = 0.0;
  mfu_above_one_ = false;
  if (flops_per_token > 0.0 && peak_flops_ > 0.0) {
    const double mfu = tokens_per_s() / double(world_size) * flops_per_token / peak_flops_;
    // Above 1 the denominator is wrong, not the run: report none.
    mfu_above_one_ = mfu > 1.0;
    if (!mfu_above_one_) {
      mfu_ = mfu;
      row.emplace_back("mfu", mfu_);
    }
  }
  return row;
}

double Throughput::tokens_per_s() const {
  return window_seconds_ > 0.0 ? double(window_tokens_) / window_seconds_ : 0.0;
}

double Throughput::samples_per_s() const {
  return window_seconds_ > 0.0 ? double(window_samples_) / window_seconds_ : 0.0;
}

double Throughput::average_tokens_per_s() const {
  return total_seconds_ > 0.0 ? double(total_tokens_) / total_seconds_ : 0.0;
}

}  // namespace strata
