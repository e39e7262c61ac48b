// bench_gate_test - The CI regression gate bites: the smoke suite run with a
// strategy made to keep one extra copy of its parameters
// (strata-bench --inject-regression CASE -> strata-gpt --debug-extra-param-copy)
// must fail against the committed baseline, naming the case and the metric.
#include "tests/run_binary.h"

#include <gtest/gtest.h>

#include <string>

namespace {
using strata::testing::BinaryRun;
using strata::testing::run_command;

BinaryRun run_bench(const std::string& args) { return run_command(std::string(STRATA_BENCH_BINARY) + " " + args); }

const std::string kBaseline = std::string(STRATA_SOURCE_DIR) + "/bench/baselines/smoke.jsonl";

TEST(BenchGateTest, ExtraParameterCopyFailsTheSmokeGateNamingCaseAndMetric) {
  const std::string victim = "smoke/gpt-nano/fsdp-2x1";
  const BinaryRun run = run_bench("--suite smoke --baseline " + kBaseline + " --inject-regression " + victim);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  // The table row and the one-line message name the case and the metric.
  EXPECT_NE(run.output.find("| " + victim + " | peak tensor bytes |"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("regression: " + victim + " peak tensor bytes"), std::string::npos) << run.output;
  // Only the injected case moved in memory.
  for (const char* other : {"smoke/gpt-nano/ddp-2x1 | peak", "smoke/gpt-nano/single-1x1 | peak"}) {
    EXPECT_EQ(run.output.find(other), std::string::npos) << other << "\n" << run.output;
  }
}

}  // namespace
