#pragma once
// The peak FLOP/s that MFU divides by, on CPU: measured once per machine,
// thread count and dtype, and cached.
//
// Why not measure in every run (as strata did): ranks sharing a machine
// measured at the same time, each seeing part of the cores, so equal work
// showed MFU 0.55, 0.88 and 1.24. Now the launcher (or a one-rank run)
// measures before any rank runs, with nothing else of the run competing, and
// writes the result to a small JSON cache the ranks read:
//   $XDG_CACHE_HOME/strata/peak_flops.json (default ~/.cache/strata/...)
// keyed by CPU model, LibTorch version, dtype and threads. `--peak-flops`
// overrides it. The measure: the best of a few 2048² matrix products in the
// precision's compute dtype (fp32, bf16, fp16: 512², ATen's CPU fp16 GEMM
// being ~40x slower than fp32 where the CPU has no fp16 arithmetic) with
// that many threads.
#include <torch/types.h>

#include <functional>
#include <string>

namespace strata::recipes {

struct PeakFlops {
  double flops = 0.0;  ///< per rank
  std::string source;  ///< "--peak-flops", "measured", "cached (PATH)", or why measuring was not cached
};

/// The default cache file (see above); "" when neither XDG_CACHE_HOME nor HOME is set.
std::string default_peak_flops_cache();

/// The per-rank peak for `threads` threads in `dtype` ("fp32", "bf16" or
/// "fp16": a precision's compute dtype): the cached value for this machine,
/// else measured now (sets and restores torch's thread count) and written to
/// `cache_path` ("" = do not cache).
PeakFlops cpu_peak_flops(int threads, const std::string& dtype, const std::string& cache_path);

/// The cache's key for this machine, LibTorch, `dtype` and `threads`:
/// "<CPU model> | torch <version> | <dtype> | <threads> thread(s)". Other
/// cached rates (recipes/app/gemm_ceiling.h) extend it.
std::string peak_cache_key(int threads, const std::string& dtype);

/// `key`'s rate in the cache at `cache_path` ("" = none), else `measure()`
/// with torch's thread count set to `threads`, written there (PeakFlops'
/// source says which). Under an flock on `cache_path`.lock, held while
/// measuring (concurrent jobs wait, then read): `measure` must not call
/// cached_rate on the same cache.
PeakFlops cached_rate(const std::string& key, const std::string& cache_path, int threads,
                      const std::function<double()>& measure);

/// Whether this CPU has `dtype` ("bf16", "fp16") arithmetic of its own, by
/// /proc/cpuinfo's flags (avx512_bf16 or amx_bf16; avx512_fp16 or amx_fp16).
bool cpu_has_native(const std::string& dtype);

/// The dtype matmuls run in under `precision` (--precision: "32",
/// "bf16-mixed", "16-mixed"), as cpu_peak_flops names it.
std::string peak_dtype(const std::string& precision);

/// What MFU divides by: `peak_flops_flag` (--peak-flops) when > 0, else on
/// CPU this machine's cached peak for this rank's threads and compute dtype,
/// else (CUDA) 0, which the Throughput callback measures on the device.
PeakFlops mfu_peak(double peak_flops_flag, const std::string& precision, const torch::Device& device);

/// fp32's matrix-product rate over that of `precision`'s compute dtype on
/// this CPU with `threads` threads (cpu_peak_flops: cached, or measured now)
/// when that dtype is slower (> 1); 0 in fp32, or when it is not slower.
double half_precision_slowdown(int threads, const std::string& precision, const std::string& cache_path);

/// One line for a run in `precision` ("bf16-mixed", "16-mixed") whose
/// compute dtype multiplies matrices slower than fp32 on this CPU with
/// `threads` threads: both rates (cpu_peak_flops: cached, or measured now),
/// the slowdown, whether the CPU has the arithmetic, and the fp32
/// alternative. "" in fp32, or when not slower. Without native bf16
/// (AVX2-only machines) bf16 trains ~10x slower than fp32 (measured on one,
/// issue 35); ATen's CPU fp16 GEMM is slow even on this AVX-512 machine.
std::string half_precision_warning(int threads, const std::string& precision, const std::string& cache_path);

}  // namespace strata::recipes
