// fp16_recipe_test - strata-gpt --precision 16-mixed through the real launcher
// (issue 22's acceptance): 30 gpt-nano steps under ddp, oss, sdp and fsdp x2
// end within 3e-2 of fp32's loss, an injected overflow (--debug-overflow-step)
// is skipped, the loss scale is in checkpoints and a resume continues with it
// exactly. Per-rank agreement is checked in-process (loss_scaling_test.cpp).
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::vector<std::string> column(const fs::path& metrics, const std::string& name) {
  return strata::testing::metrics_column(metrics, name);
}

std::string base_args(const std::string& strategy, const std::string& precision, const fs::path& out,
                      int steps = 30) {
  const int nproc = strategy == "single" ? 1 : 2;
  std::ostringstream args;
  args << "--preset gpt-nano --data addition:2 --max-steps " << steps << " --warmup-steps 5 --lr 3e-3 --strategy " << strategy
       << " --nproc " << nproc << " --batch-size " << 16 / nproc << " --precision " << precision
       << " --threads-per-rank 1 --log-every-n-steps 1 --limit-val-batches 1 --progress-bar false"
       << " --comm-timeout 60 --output-dir " << out.string();
  return args.str();
}

/// Standard base64 (what checkpoint metadata stores state values in).
std::string base64_decode(const std::string& in) {
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int bits = 0, value = 0;
  for (char ch : in) {
    const auto pos = alphabet.find(ch);
    if (pos == std::string::npos) break;  // '=' padding
    value = (value << 6) | static_cast<int>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((value >> bits) & 0xff));
    }
  }
  return out;
}

double final_loss(const fs::path& out) { return read_json(out / "summary.json")["final_train_loss"].get<double>(); }

TEST(Fp16RecipeTest, ThirtyStepsMatchFp32AndSkipTheInjectedOverflowUnderEveryStrategy) {
  strata::testing::TempDir dir("strata-fp16-recipe");
  for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
    const fs::path fp32 = dir.path() / (strategy + "-32"), fp16 = dir.path() / (strategy + "-16"),
                   skip = dir.path() / (strategy + "-16-skip");
    for (const auto& [out, extra] : {std::pair{fp32, std::string()}, std::pair{fp16, std::string()},
                                     std::pair{skip, std::string(" --debug-overflow-step 5 --hysteresis 1 "
                                                                 "--checkpoint-every 10 --checkpoint-keep 0")}}) {
      auto run = run_gpt_binary(base_args(strategy, out == fp32 ? "32" : "16-mixed", out) + extra);
      ASSERT_EQ(run.exit_code, 0) << run.output;
    }
    // Measured here (AVX-512): |diff| 1e-4 without the overflow; with it,
    // one step fewer (the 5th, in warmup), 0.024.
    const double diff = std::abs(final_loss(fp16) - final_loss(fp32));
    const double skip_diff = std::abs(final_loss(skip) - final_loss(fp32));
    std::cout << "[ fp16 vs fp32 ] " << strategy << " x2, 30 steps: final loss " << final_loss(fp16) << " vs "
              << final_loss(fp32) << " (|diff| " << diff << "), with step 5 skipped |diff| " << skip_diff
              << std::endl;
    EXPECT_LE(diff, 1e-3) << strategy;  // the issue asks 3e-2; this is 10x the measured difference
    EXPECT_LE(skip_diff, 6e-2) << strategy;
    const auto got = read_json(skip / "summary.json");
    // The overflow at step 5 halves the scale (hysteresis 1) and skips that step only.
    EXPECT_EQ(got["skipped_steps"], 1) << strategy;
    EXPECT_EQ(got["loss_scale"], 32768.0) << strategy;
    const auto scales = column(skip / "metrics.csv", "loss_scale");
    const auto skipped = column(skip / "metrics.csv", "skipped_steps");
    ASSERT_EQ(scales.size(), 30u) << strategy;
    EXPECT_EQ(scales[4], "65536") << strategy;
    EXPECT_EQ(scales[5], "32768") << strategy;
    EXPECT_EQ(skipped[3], "0") << strategy;
    EXPECT_EQ(skipped[4], "1") << strategy;
    // The scale and its counters are in the checkpoint.
    const auto meta = read_json(skip / "checkpoints" / "step-10" / "metadata.json");
    ASSERT_TRUE(meta.contains("body")) << strategy;
    const auto state = meta["body"]["meta"]["state"];
    ASSERT_TRUE(state.contains("trainer/loss_scaler")) << strategy << ": " << state.dump();
    EXPECT_EQ(base64_decode(state["trainer/loss_scaler"].get<std::string>()),
              "scale=32768 iteration=10 last_overflow=4 hysteresis_left=1 skipped=1")
        << strategy;
  }
}

TEST(Fp16RecipeTest, ResumeContinuesWithTheSavedScale) {
  // A scale that moves: halved at step 2, doubled every 3 clean steps after.
  strata::testing::TempDir dir("strata-fp16-resume");
  const std::string scaling = " --debug-overflow-step 2 --hysteresis 1 --loss-scale-window 3 "
                              "--checkpoint-every 4 --checkpoint-keep 0";
  const fs::path whole = dir.path() / "whole", resumed = dir.path() / "resumed";
  auto a = run_gpt_binary(base_args("fsdp", "16-mixed", whole, 12) + scaling + " --dump-params " +
                          (dir.path() / "whole.pt").string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Interrupted at the start of step 5: step-4 is the newest checkpoint.
  auto b = run_gpt_binary(base_args("fsdp", "16-mixed", resumed, 12) + scaling, "STRATA_TEST_FAIL_AT_STEP=5");
  ASSERT_NE(b.exit_code, 0) << b.output;
  auto c = run_gpt_binary(base_args("fsdp", "16-mixed", resumed, 12) + scaling + " --resume last --dump-params " +
                          (dir.path() / "resumed.pt").string());
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const auto want = column(whole / "metrics.csv", "loss_scale");
  const auto got = column(resumed / "metrics.csv", "loss_scale");
  ASSERT_EQ(want.size(), 12u);
  EXPECT_EQ(got, want);
  EXPECT_NE(want[4], want[1]) << "the scale did not move: the test would not see a lost state";
  const auto p = strata::testing::load_archive(dir.path() / "whole.pt");
  const auto q = strata::testing::load_archive(dir.path() / "resumed.pt");
  ASSERT_EQ(p.size(), q.size());
  for (const auto& [name, value] : p) EXPECT_TRUE(torch::equal(value, q.at(name))) << name;
}

}  // namespace
