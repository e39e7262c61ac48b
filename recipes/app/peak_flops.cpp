#include "strata/recipes/app/peak_flops.h"

#include "strata/callbacks/throughput.h"
#include "strata/core/atomic_file.h"
#include "strata/core/precision.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace strata::recipes {
namespace fs = std::filesystem;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown cpu";
}

}  // namespace

std::string default_peak_flops_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "strata" / "peak_flops.json").string();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (fs::path(home) / ".cache" / "strata" / "peak_flops.json").string();
  }
  return "";
}

std::string peak_cache_key(int threads, const std::string& dtype) {
  std::ostringstream key;
  key << cpu_model() << " | torch " << TORCH_VERSION << " | " << dtype << " | " << threads << " thread(s)";
  return key.str();
}

namespace {

/// An exclusive flock(2) on `path` (created when missing) for its lifetime;
/// nothing when it cannot be taken within `patience` (a job stopped while it
/// measured must not stall every later start) or at all: the cache is only a
/// cache.
class CacheLock {
 public:
  explicit CacheLock(const std::string& path, std::chrono::seconds patience = std::chrono::seconds(600)) {
    if (path.empty()) return;
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    const auto give_up = std::chrono::steady_clock::now() + patience;
    while (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > give_up) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

PeakFlops cached_rate(const std::string& key, const std::string& cache_path, int threads,
                      const std::function<double()>& measure) {
  // Why a lock, held while measuring: two jobs starting together (ctest -j2,
  // a sweep) would each read the cache, measure, and write back their own
  // copy, losing the other's key; and both would measure on cores the other
  // is loading. With it, the second waits and finds the first's result.
  const CacheLock lock(cache_path.empty() ? "" : cache_path + ".lock");
  nlohmann::json cache = nlohmann::json::object();
  if (std::ifstream in(cache_path); !cache_path.empty() && in) {
    // A damaged cache is re-measured, never an error: it is only a cache.
    cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!cache.is_object()) cache = nlohmann::json::object();
  }
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() > 0.0) {
    return {cache[key].get<double>(), "cached (" + cache_path + ")"};
  }
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  const double flops = measure();
  at::set_num_threads(previous);
  if (cache_path.empty()) return {flops, "measured (no cache: neither XDG_CACHE_HOME nor HOME is set)"};
  cache[key] = flops;
  std::error_code ec;
  fs::create_directories(fs::path(cache_path).parent_path(), ec);  // the lock may not have been taken
  try {
    write_file_atomically(cache_path, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    return {flops, std::string("measured (not cached: ") + e.what() + ")"};
  }
  return {flops, "measured"};
}

PeakFlops cpu_peak_flops(int threads, const std::string& dtype, const std::string& cache_path) {
  TORCH_CHECK_VALUE(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "cpu_peak_flops: unknown dtype '", dtype,
                    "'; allowed: fp32, bf16, fp16");
  return cached_rate(peak_cache_key(threads, dtype), cache_path, threads, [&dtype] {
    return dtype == "fp16" ? measure_matmul_peak_flops(/*n=*/512, /*repeats=*/4, torch::kHalf)
                           : measure_matmul_peak_flops(/*n=*/2048, /*repeats=*/4,
                                                       dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  });
}

bool cpu_has_native(const std::string& dtype) {
  const std::vector<std::string> flags = dtype == "bf16"   ? std::vector<std::string>{"avx512_bf16", "amx_bf16"}
                                         : dtype == "fp16" ? std::vector<std::string>{"avx512_fp16", "amx_fp16"}
                                                           : std::vector<std::string>{};
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string word; words >> word;) {
      if (std::find(flags.begin(), flags.end(), word) != flags.end()) return true;
    }
    return false;  // every core lists the same flags
  }
  return false;
}

std::string peak_dtype(const std::string& precision) {
  const auto dtype = compute_dtype(parse_precision(precision));
  return !dtype ? "fp32" : *dtype == at::kHalf ? "fp16" : "bf16";
}

PeakFlops mfu_peak(double peak_flops_flag, const std::string& precision, const torch::Device& device) {
  if (peak_flops_flag > 0.0) return {peak_flops_flag, "--peak-flops"};
  if (device.is_cuda()) return {0.0, "measured on " + device.str() + " in " + peak_dtype(precision)};
  return cpu_peak_flops(at::get_num_threads(), peak_dtype(precision), default_peak_flops_cache());
}

double half_precision_slowdown(int threads, const std::string& precision, const std::string& cache_path) {
  const std::string dtype = peak_dtype(precision);
  if (dtype == "fp32") return 0.0;
  const double half = cpu_peak_flops(threads, dtype, cache_path).flops;
  const double fp32 = cpu_peak_flops(threads, "fp32", cache_path).flops;
  return half > 0.0 && fp32 > half ? fp32 / half : 0.0;
}

std::string half_precision_warning(int threads, const std::string& precision, const std::string& cache_path) {
  if (half_precision_slowdown(threads, precision, cache_path) == 0.0) return "";
  const std::string dtype = peak_dtype(precision);
  // Both cached by the call above: read again for the line's numbers and sources.
  const PeakFlops half = cpu_peak_flops(threads, dtype, cache_path);
  const PeakFlops fp32 = cpu_peak_flops(threads, "fp32", cache_path);
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(1);
  const bool cached = half.source.rfind("cached", 0) == 0;
  line << "warning: --precision " << precision << " multiplies matrices in " << dtype << " at " << half.flops / 1e9
       << " GFLOP/s on this CPU against fp32's " << fp32.flops / 1e9 << " (" << threads << " thread(s), "
       << (cached ? "measured earlier, cached" : "measured now") << "): " << fp32.flops / half.flops
       << "x slower, the CPU has " << (cpu_has_native(dtype) ? "" : "no ") << dtype
       << " instructions; --precision 32 trains faster here";
  return line.str();
}

}  // namespace strata::recipes
