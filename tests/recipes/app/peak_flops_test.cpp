// peak_flops_test - the GEMM-bound ceiling (recipes/app/gemm_ceiling.h): the
// step's products, their cached rate, and summary.json's share of it. And the
// one-line warning for a half precision that
// multiplies matrices slower than fp32 on this CPU (an AVX2-only machine's
// bf16, most CPUs' fp16): from the cached rates, and from strata-gpt once per
// run, before its ranks start. The rates come from a cache file of this
// test's own, written under this machine's keys with a slow bf16 rate
// (AVX2-only: ~0.2 GFLOP/s against ~90 fp32), so the test does not depend
// on which CPU runs it.
#include "strata/recipes/app/gemm_ceiling.h"
#include "strata/recipes/app/peak_flops.h"
#include "strata/recipes/models/gpt/spec.h"
#include "strata/recipes/data/data.h"
#include "tests/run_binary.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <filesystem>
#include <fstream>
#include <string>

namespace {
namespace fs = std::filesystem;
using namespace strata::recipes;

const fs::path& scratch() {
  static const strata::testing::TempDir dir("strata-peak-flops-test");
  return dir.path();
}

/// $XDG_CACHE_HOME/strata/peak_flops.json holding this machine's 1-thread
/// fp32 and bf16 rates as `fp32` and `bf16` (nothing measured).
fs::path cache_with(const std::string& name, double fp32, double bf16) {
  const fs::path home = scratch() / name, file = home / "strata" / "peak_flops.json";
  fs::create_directories(file.parent_path());
  nlohmann::json cache;
  cache[peak_cache_key(1, "fp32")] = fp32;
  cache[peak_cache_key(1, "bf16")] = bf16;
  std::ofstream(file) << cache.dump(2);
  return home;
}

TEST(SlowHalfPrecisionTest, NamesBothRatesTheSlowdownAndTheFp32Alternative) {
  const fs::path slow = cache_with("slow", 90e9, 0.2e9);
  const std::string file = (slow / "strata" / "peak_flops.json").string();
  const std::string line = half_precision_warning(1, "bf16-mixed", file);
  EXPECT_EQ(line.rfind("warning: --precision bf16-mixed multiplies matrices in bf16 at 0.2 GFLOP/s", 0), 0u) << line;
  EXPECT_NE(line.find("against fp32's 90.0"), std::string::npos) << line;
  EXPECT_NE(line.find("450.0x slower"), std::string::npos) << line;
  EXPECT_NE(line.find("--precision 32 trains faster here"), std::string::npos) << line;
  EXPECT_NE(line.find(cpu_has_native("bf16") ? "the CPU has bf16" : "the CPU has no bf16"), std::string::npos)
      << line;
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 0) << "one line";
  // Not slower, or fp32: nothing to say.
  const fs::path fast = cache_with("fast", 90e9, 400e9);
  EXPECT_EQ(half_precision_warning(1, "bf16-mixed", (fast / "strata" / "peak_flops.json").string()), "");
  EXPECT_EQ(half_precision_warning(1, "32", file), "");
}

TEST(SlowHalfPrecisionTest, StrataGptSaysItOnceBeforeTraining) {
  const fs::path slow = cache_with("slow-run", 90e9, 0.2e9);
  for (const std::string ranks : {"1", "2"}) {
    const auto run = strata::testing::run_gpt_binary(
        "--preset gpt-nano --data addition:2 --precision bf16-mixed --max-steps 1 --threads-per-rank 1 "
        "--limit-val-batches 0 --progress-bar false --strategy " + (ranks == "1" ? std::string("single") : "ddp") +
        " --nproc " + ranks + " --output-dir " +
            (scratch() / ("out" + ranks)).string(),
        "XDG_CACHE_HOME=" + slow.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::string head = "warning: --precision bf16-mixed multiplies matrices in bf16 at 0.2 GFLOP/s";
    const auto first = run.output.find(head);
    EXPECT_NE(first, std::string::npos) << run.output;
    EXPECT_EQ(run.output.find(head, first + 1), std::string::npos) << "once per run, not per rank:\n" << run.output;
  }
  const fs::path fast = cache_with("fast-run", 90e9, 400e9);
  const auto run = strata::testing::run_gpt_binary(
      "--preset gpt-nano --data addition:2 --precision bf16-mixed --max-steps 1 --threads-per-rank 1 "
      "--limit-val-batches 0 --progress-bar false --output-dir " + (scratch() / "out-fast").string(),
      "XDG_CACHE_HOME=" + fast.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("warning: --precision"), std::string::npos) << run.output;
}

TEST(GemmCeilingTest, TheStepsProductsAreSixFlopsPerLinearWeightAndToken) {
  // Forward, input gradient and weight gradient of every Linear, the head's
  // included: 6 FLOPs per weight and token, the 6N of MFU without the
  // attention's 12·L·H·Q·T (its kernel is not a GEMM).
  const auto model = gpt_preset("gpt-mini").vocab_size(65).block_size(128);
  const int64_t tokens = 8 * 128, c = model.n_embd();
  double flops = 0.0;
  int64_t products = 0;
  for (const auto& s : gpt_model(model)->step_gemms(tokens)) {
    flops += s.flops();
    products += s.count;
  }
  const double weights = double(12 * c * c * model.n_layer() + model.vocab_size() * c);
  EXPECT_DOUBLE_EQ(flops, 6.0 * weights * double(tokens));
  EXPECT_EQ(products, 3 * (4 * model.n_layer() + 1));
}

TEST(GemmCeilingTest, TheRateIsCachedAndSummaryJsonDividesByIt) {
  const fs::path home = scratch() / "ceiling";
  const std::string file = (home / "strata" / "peak_flops.json").string();
  const auto data = make_data("addition:2", 0, 50257, 1);
  const auto model = gpt_preset("gpt-nano").vocab_size(data->vocab_size()).block_size(data->block_size());
  const auto shapes = gpt_model(model)->step_gemms(4 * model.block_size());
  const PeakFlops first = cpu_gemm_rate(shapes, 1, "fp32", file);
  EXPECT_EQ(first.source, "measured");
  const PeakFlops again = cpu_gemm_rate(shapes, 1, "fp32", file);
  EXPECT_EQ(again.flops, first.flops);
  EXPECT_EQ(again.source.rfind("cached", 0), 0u) << again.source;
  // strata-gpt over 2 ranks reads that rate: the job's ceiling is 2 ranks'.
  const fs::path out = scratch() / "ceiling-run";
  const auto run = strata::testing::run_gpt_binary(
      "--preset gpt-nano --data addition:2 --batch-size 4 --max-steps 3 --threads-per-rank 1 --strategy ddp "
      "--nproc 2 --limit-val-batches 0 --progress-bar false --output-dir " + out.string(),
      "XDG_CACHE_HOME=" + home.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json summary;
  std::ifstream(out / "summary.json") >> summary;
  GPTModule module(model, /*deferred=*/true);
  EXPECT_NEAR(summary.at("gemm_ceiling_tokens_per_s").get<double>(), 2.0 * first.flops / module.flops_per_token(),
              1e-6 * first.flops / module.flops_per_token());
  EXPECT_NEAR(summary.at("ceiling_share").get<double>() * summary.at("gemm_ceiling_tokens_per_s").get<double>(),
              summary.at("tokens_per_s").get<double>(), 1e-6 * summary.at("tokens_per_s").get<double>());
  EXPECT_NE(run.output.find("of the GEMM ceiling"), std::string::npos) << run.output;
}

// Jobs that start together share the cache: each key written survives, and
// each is measured once (the others wait on the cache's lock and read it).
TEST(PeakFlopsCacheTest, JobsStartingTogetherKeepEachOthersKeys) {
  const std::string file = (scratch() / "together" / "peak_flops.json").string();
  constexpr int kJobs = 4;
  std::atomic<int> measured{0};
  std::vector<std::thread> jobs;
  for (int j = 0; j < kJobs; ++j) {
    jobs.emplace_back([&, j] {
      for (const std::string& key : {std::string("shared"), "job " + std::to_string(j)}) {
        cached_rate(key, file, 1, [&] {
          ++measured;
          std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a measurement takes a while
          return 1e9;
        });
      }
    });
  }
  for (auto& t : jobs) t.join();
  nlohmann::json cache;
  std::ifstream(file) >> cache;
  for (int j = 0; j < kJobs; ++j) EXPECT_TRUE(cache.contains("job " + std::to_string(j))) << cache.dump();
  EXPECT_TRUE(cache.contains("shared")) << cache.dump();
  EXPECT_EQ(measured.load(), kJobs + 1) << "the shared key is measured once";
}

}  // namespace
