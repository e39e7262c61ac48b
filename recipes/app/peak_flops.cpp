#include "strata/recipes/app/peak_flops.h"

#include "strata/callbacks/throughput.h"
#include "strata/core/atomic_file.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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

std::string cache_key(int threads, const std::string& dtype) {
  std::ostringstream key;
  key << cpu_model() << " | torch " << TORCH_VERSION << " | " << dtype << " | " << threads
      << " thread(s)";
  return key.str();
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  // A damaged cache is re-measured, never an error: it is only a cache.
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
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

PeakFlops cpu_peak_flops(int threads, const std::string& dtype, const std::string& cache_path) {
  TORCH_CHECK_VALUE(dtype == "fp32" || dtype == "bf16" || dtype == "fp16", "cpu_peak_flops: unknown dtype '", dtype,
                    "'; allowed: fp32, bf16, fp16");
  const std::string key = cache_key(threads, dtype);
  auto cache = cache_path.empty() ? nlohmann::json::object() : read_cache(cache_path);
  if (cache.contains(key) && cache[key].is_number() && cache[key].get<double>() > 0.0) {
    return {cache[key].get<double>(), "cached (" + cache_path + ")"};
  }
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  const double flops =
      dtype == "fp16" ? measure_matmul_peak_flops(/*n=*/512, /*repeats=*/4, torch::kHalf)
                      : measure_matmul_peak_flops(/*n=*/2048, /*repeats=*/4,
                                                  dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32);
  at::set_num_threads(previous);
  if (cache_path.empty()) return {flops, "measured (no cache: neither XDG_CACHE_HOME nor HOME is set)"};
  cache[key] = flops;
  std::error_code ec;
  fs::create_directories(fs::path(cache_path).parent_path(), ec);
  try {
    write_file_atomically(cache_path, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    return {flops, std::string("measured (not cached: ") + e.what() + ")"};
  }
  return {flops, "measured"};
}

}  // namespace strata::recipes
