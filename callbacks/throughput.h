#pragma once
// Throughput: tokens/s, samples/s and MFU (model FLOPs utilization).
//
// Rates are over a rolling window of the last `window` steps (sum of tokens /
// sum of step seconds), from StepMetrics (which count all ranks). The first
// step this callback sees is warm-up (allocator, thread pools, lazy init) and
// is kept out of every average.
//
//   mfu = tokens/s per rank * module.flops_per_token() / peak_flops
//
// where peak_flops is given in the options (strata-gpt: recipes/app/peak_flops.h,
// measured once per machine), else this process's fp32 matmul speed with the
// current torch thread count, measured by measure_matmul_peak_flops() in
// on_fit_start. An MFU above 1 means the peak is wrong: mfu() is then 0
// (unknown) and mfu_above_one() true. Logs "tokens_per_s", "samples_per_s" and "mfu"
// (the latter only when the module reports flops_per_token) with trainer.log()
// in on_train_batch_end, from the second step on.
//
// Example:
//   auto tp = std::make_shared<strata::Throughput>(strata::ThroughputOptions().window(50));
//   ... trainer.fit(module, data);
//   std::cout << tp->average_tokens_per_s() << " tok/s, MFU " << tp->mfu() << "\n";
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <string>

namespace strata {

/// FLOP/s of n×n matrix products (2n³ FLOPs each) in `dtype` (float32 or
/// bfloat16) with the current torch threads: the best of `repeats` timed
/// products after one warm-up product (fewer when they take over ~2 s in all,
/// as on the reference BLAS). Its buffers bypass the CPU allocator, so a
/// MemoryTracker's peak is unaffected.
double measure_matmul_peak_flops(int64_t n = 1024, int repeats = 5, torch::Dtype dtype = torch::kFloat32);

/// The same for cuda:index in `dtype`, timed between device synchronizations
/// (fp32 is LibTorch's default math: no TF32). The probe's tensors are freed,
/// and the device's peak-allocated counter reset, before it returns.
double measure_cuda_matmul_peak_flops(int index, int64_t n = 4096, int repeats = 10,
                                      torch::Dtype dtype = torch::kFloat32);

/// Result of check_blas_speed().
struct BlasCheck {
  double gflops = 0.0;
  bool slow = false;     ///< below the threshold
  std::string message;   ///< one line; a warning when slow
};

/// Quick (< 0.3 s) probe of the BLAS behind torch::mm. Any optimized BLAS
/// (OpenBLAS, MKL) exceeds 20 GFLOP/s even on one thread, while Debian's
/// reference BLAS stays near 5 GFLOP/s whatever the thread count (it is
/// single-threaded), so one threshold separates them on any core count. When
/// slow, `message` is a one-line warning that names the fix. The binaries print
/// it at start-up.
BlasCheck check_blas_speed(double min_gflops = 20.0);

struct ThroughputOptions {
  /// Steps in the rolling window.
  TORCH_ARG(int64_t, window) = 20;
  /// Peak FLOP/s of one rank for MFU; 0: measure once in on_fit_start.
  TORCH_ARG(double, peak_flops) = 0.0;
  /// Matrix size of that measurement.
  TORCH_ARG(int64_t, peak_matmul_size) = 1024;
  /// The dtype the model's matmuls run in (bf16 under bf16-mixed): the peak
  /// is that dtype's, or a bf16 run on a GPU divides by the fp32 rate and its
  /// MFU comes out above 1 (seen on an H200: 51 TFLOP/s fp32 probe).
  TORCH_ARG(torch::Dtype, peak_dtype) = torch::kFloat32;
};

class Throughput : public Callback {
 public:
  explicit Throughput(ThroughputOptions options = {});

  std::string name() const override { return "Throughput"; }

  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepMetrics& metrics) override;

  /// Adds one step (what on_train_batch_end does) and returns the values to
  /// log: empty for the first (warm-up) step; "mfu" only when
  /// flops_per_token > 0 and peak_flops() > 0.
  LogRow update(const StepMetrics& metrics, int world_size, double flops_per_token);

  /// Rolling window, all ranks.
  double tokens_per_s() const;
  double samples_per_s() const;
  /// MFU of the last update (0 when unknown, or when above 1: see mfu_above_one()).
  double mfu() const { return mfu_; }
  /// The last update computed an MFU above 1 (the peak is too low) and logged none.
  bool mfu_above_one() const { return mfu_above_one_; }
  /// Tokens/s over every step but the first, all ranks.
  double average_tokens_per_s() const;
  /// FLOP/s used for MFU (0 before it is measured).
  double peak_flops() const { return peak_flops_; }
  /// Steps seen, the warm-up step included.
  int64_t steps() const { return steps_; }

 private:
  struct Sample {
    int64_t tokens;
    int64_t samples;
    double seconds;
  };

  ThroughputOptions options_;
  double peak_flops_ = 0.0;
  std::deque<Sample> window_;
  int64_t window_tokens_ = 0;
  int64_t window_samples_ = 0;
  double window_seconds_ = 0.0;
  int64_t steps_ = 0;
  int64_t total_tokens_ = 0;  ///< warm-up step excluded
  double total_seconds_ = 0.0;
  double mfu_ = 0.0;
  bool mfu_above_one_ = false;
};

}  // namespace strata
