// config_file_test - strata-gpt --config with the DeepSpeed and Accelerate
// configurations from those projects' documentation (tests/fixtures/configs):
// each runs as the strategy it names, at its process count and precision;
// an unsupported key and a train_batch_size that disagrees with the world
// are one-line errors with exit 2 and nothing written.
#include "tests/run_binary.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

const fs::path kConfigs = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "configs";
const std::string kTiny = "--preset gpt-nano --data addition:2 --max-steps 3 --batch-size 4 --threads-per-rank 1 "
                          "--limit-val-batches 0 --log-every-n-steps 1 --progress-bar false ";

nlohmann::json summary_of(const fs::path& out) {
  std::ifstream in(out / "summary.json");
  return nlohmann::json::parse(in);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ConfigFileTest, DeepSpeedZero3OffloadExampleRunsAsFsdp) {
  // Verbatim from DeepSpeed's ZeRO tutorial: stage 3, optimizer and
  // parameters offloaded to cpu. On a CPU device that state is in host
  // memory already: a note says nothing is offloaded.
  strata::testing::TempDir dir("strata-config");
  const fs::path out = dir.path() / "out";
  auto run = run_gpt_binary(kTiny + "--nproc 2 --config " + (kConfigs / "ds_zero3_offload_cpu.json").string() +
                            " --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("note: --config offloads to cpu (host memory)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("accepted without effect"), std::string::npos) << run.output;
  const auto summary = summary_of(out);
  EXPECT_EQ(summary.at("strategy"), "fsdp");
  EXPECT_EQ(summary.at("world_size"), 2);
  const std::string ini = read_text(out / "config.ini");
  EXPECT_NE(ini.find("strategy = fsdp"), std::string::npos) << ini;
  EXPECT_NE(ini.find("offload = none"), std::string::npos) << ini;
}

TEST(ConfigFileTest, DeepSpeedNvmeExampleOffloadsToItsPath) {
  // The transformers docs' NVMe example, its nvme_path pointed at a scratch
  // directory (the only edit): fsdp with --offload disk there.
  strata::testing::TempDir dir("strata-config");
  std::string text = read_text(kConfigs / "ds_zero3_offload_nvme.json");
  for (size_t at; (at = text.find("/local_nvme")) != std::string::npos;) text.replace(at, 11, dir.path().string());
  std::ofstream(dir.file("ds.json")) << text;
  const fs::path out = dir.path() / "out";
  auto run = run_gpt_binary(kTiny + "--nproc 2 --config " + dir.file("ds.json") + " --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto summary = summary_of(out);
  EXPECT_EQ(summary.at("strategy"), "fsdp");
  EXPECT_GT(summary.at("offload_bytes").get<double>(), 0.0) << summary.dump();
}

TEST(ConfigFileTest, AccelerateFsdpConfigOutputRunsWithItsProcessesAndPrecision) {
  strata::testing::TempDir dir("strata-config");
  const fs::path out = dir.path() / "out";
  auto run = run_gpt_binary(kTiny + "--config " + (kConfigs / "accelerate_fsdp.yaml").string() + " --output-dir " +
                            out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto summary = summary_of(out);
  EXPECT_EQ(summary.at("strategy"), "fsdp");
  EXPECT_EQ(summary.at("world_size"), 2);  // num_processes: 2
  EXPECT_EQ(summary.at("precision"), "bf16-mixed");
}

TEST(ConfigFileTest, UnsupportedKeyOrDisagreeingBatchIsExitTwoAndWritesNothing) {
  strata::testing::TempDir dir("strata-config");
  const fs::path out = dir.path() / "out";
  std::ofstream(dir.file("ds.json")) << R"({"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}})";
  auto run = run_gpt_binary(kTiny + "--config " + dir.file("ds.json") + " --output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("zero_optimization.zero_hpz_partition_size"), std::string::npos) << run.output;
  EXPECT_FALSE(fs::exists(out));
  // Micro-batch 4 x 2 ranks does not divide 12.
  std::ofstream(dir.file("batch.json")) << R"({"train_batch_size": 12, "zero_optimization": {"stage": 1}})";
  run = run_gpt_binary(kTiny + "--nproc 2 --config " + dir.file("batch.json") + " --output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train_batch_size 12 is not a multiple of micro-batch x world = 8"), std::string::npos)
      << run.output;
  // All three given and disagreeing.
  std::ofstream(dir.file("all.json"))
      << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1})";
  run = run_gpt_binary(kTiny + "--nproc 2 --strategy ddp --config " + dir.file("all.json") + " --output-dir " +
                       out.string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("train_batch_size 16 != micro-batch 4 x accumulation 1 x world 2 = 8"), std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(out));
}

TEST(ConfigFileTest, TrainBatchSizeDerivesTheAccumulationAsDeepSpeedDoes) {
  // DeepSpeed's rule: train_batch_size with the micro-batch gives the
  // accumulation (16 / (4 x 2 ranks) = 2).
  strata::testing::TempDir dir("strata-config");
  const fs::path out = dir.path() / "out";
  std::ofstream(dir.file("batch.json")) << R"({"train_batch_size": 16, "zero_optimization": {"stage": 1}})";
  auto run = run_gpt_binary(kTiny + "--nproc 2 --config " + dir.file("batch.json") + " --output-dir " + out.string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string ini = read_text(out / "config.ini");
  EXPECT_NE(ini.find("accumulate-grad-batches = 2"), std::string::npos) << ini;
  EXPECT_NE(ini.find("strategy = oss"), std::string::npos) << ini;
}

}  // namespace
