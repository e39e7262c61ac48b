#include "strata/recipes/app/gemm_ceiling.h"

#include "strata/core/atomic_file.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

namespace strata::recipes {
namespace fs = std::filesystem;

std::vector<GemmShape> gpt_step_gemms(const GPTOptions& o, int64_t tokens) {
  const int64_t c = o.n_embd(), l = o.n_layer();
  // (in, out, how many) of every Linear a step runs; the head: the tied
  // embedding's [V, C] as a Linear [C -> V].
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> linears = {
      {c, 3 * c, l}, {c, c, l}, {c, 4 * c, l}, {4 * c, c, l}, {c, o.vocab_size(), 1}};
  std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> count;
  for (const auto& [in, out, times] : linears) {
    count[{tokens, in, out}] += times;   // forward
    count[{tokens, out, in}] += times;   // the input's gradient
    count[{out, tokens, in}] += times;   // the weight's gradient
  }
  std::vector<GemmShape> shapes;
  for (const auto& [shape, times] : count) shapes.push_back({std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), times});
  return shapes;
}

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find_first_not_of(" \t:", line.find(':')));
  }
  return "unknown cpu";
}

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
  key << cpu_model_name() << " | torch " << TORCH_VERSION << " | " << dtype << " | " << threads << " thread(s) | gemms";
  for (const auto& s : shapes) key << " " << s.count << "*" << s.m << "x" << s.k << "x" << s.n;
  nlohmann::json cache = nlohmann::json::object();
  if (!cache_path.empty()) {
    std::ifstream in(cache_path);
    if (in) cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!cache.is_object()) cache = nlohmann::json::object();  // a damaged cache is re-measured
  }
  if (cache.contains(key.str()) && cache[key.str()].is_number() && cache[key.str()].get<double>() > 0.0) {
    return {cache[key.str()].get<double>(), "cached (" + cache_path + ")"};
  }
  const auto type = dtype == "fp32" ? torch::kFloat32 : dtype == "bf16" ? torch::kBFloat16 : torch::kHalf;
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  double flops = 0.0, seconds = 0.0;
  for (const auto& s : shapes) {
    flops += s.flops();
    seconds += double(s.count) * best_seconds(s.m, s.k, s.n, type);  // each repeat costs alike
  }
  at::set_num_threads(previous);
  const double rate = flops / std::max(seconds, 1e-9);
  if (cache_path.empty()) return {rate, "measured (no cache)"};
  cache[key.str()] = rate;
  std::error_code ec;
  fs::create_directories(fs::path(cache_path).parent_path(), ec);
  try {
    write_file_atomically(cache_path, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    return {rate, std::string("measured (not cached: ") + e.what() + ")"};
  }
  return {rate, "measured"};
}

double gemm_ceiling_tokens_per_s(const GPTOptions& model, int64_t micro_batch, double flops_per_token,
                                 const std::string& precision, int threads, const std::string& cache_path) {
  TORCH_CHECK_VALUE(flops_per_token > 0.0, "gemm ceiling: FLOPs per token must be > 0, got ", flops_per_token);
  const auto shapes = gpt_step_gemms(model, micro_batch * model.block_size());
  return cpu_gemm_rate(shapes, threads, peak_dtype(precision), cache_path).flops / flops_per_token;
}

}  // namespace strata::recipes
