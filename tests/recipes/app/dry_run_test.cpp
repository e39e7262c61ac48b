// dry_run_test - strata-gpt --dry-run against real runs: at 2, 3 and 4 ranks,
// under every data-parallel strategy, the dry run's bytes sent per step by
// each collective kind equal what the real run's ranks sent (summary.json),
// its model state equals theirs byte for byte, and the planner's peak it
// prints is within the planner's stated 10% of the real peak. Plus its
// contract: nothing written, and no launcher. The Llama presets up to
// llama-3.1-405b at 1,024 ranks hold the formula's state.
#include "strata/recipes/models/llama/spec.h"
#include "tests/run_binary.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

const fs::path& scratch() {
  static const strata::testing::TempDir dir("strata-dry-run-test");
  return dir.path();
}

/// The planner suite's shape (docs/strategies.md): gpt-nano, block 128, batch 8, text.
std::string flags(const std::string& strategy, int world) {
  return "--preset gpt-nano --data " STRATA_SOURCE_DIR "/docs/design.md --block-size 128 --batch-size 8 "
         "--threads-per-rank 1 --progress-bar false --limit-val-batches 0 --max-steps 4 --strategy " +
         strategy + " --nproc " + std::to_string(world);
}

/// "<what>, rank R: key=value ..." lines of the dry run's output, as numbers.
std::map<std::string, int64_t> numbers(const std::string& output, const std::string& what, int rank) {
  std::map<std::string, int64_t> out;
  const std::string head = what + ", rank " + std::to_string(rank) + ":";
  const auto at = output.find(head);
  if (at == std::string::npos) return out;
  const std::string line = output.substr(at + head.size(), output.find('\n', at) - at - head.size());
  const std::regex pair("([a-z_]+)=([0-9]+)");
  for (std::sregex_iterator it(line.begin(), line.end(), pair), end; it != end; ++it) {
    out[(*it)[1]] = std::stoll((*it)[2]);
  }
  return out;
}

void expect_dry_run_matches_real_runs(int world) {
  for (const std::string strategy : {"ddp", "oss", "sdp", "fsdp"}) {
    SCOPED_TRACE(strategy + " x " + std::to_string(world));
    const fs::path out = scratch() / (strategy + std::to_string(world));
    const auto real = run_gpt_binary(flags(strategy, world) + " --output-dir " + out.string());
    ASSERT_EQ(real.exit_code, 0) << real.output;
    const fs::path dry_out = scratch() / (strategy + std::to_string(world) + "-dry");
    const auto dry = run_gpt_binary(flags(strategy, world) + " --dry-run --output-dir " + dry_out.string());
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    EXPECT_FALSE(fs::exists(dry_out)) << "a dry run writes nothing";
    std::ifstream in(out / "summary.json");
    const auto summary = nlohmann::json::parse(in);
    for (int rank : {0, world - 1}) {
      const auto sent = numbers(dry.output, "bytes sent per step", rank);
      ASSERT_FALSE(sent.empty()) << "rank " << rank << "\n" << dry.output;
      int64_t total = 0;
      for (const auto& [kind, bytes] : summary["per_rank"][rank]["comm_bytes_per_step"].items()) {
        const double real_bytes = bytes.get<double>();
        const int64_t dry_bytes = sent.count(kind) ? sent.at(kind) : 0;
        EXPECT_EQ(dry_bytes, static_cast<int64_t>(real_bytes)) << kind << ", rank " << rank << "\n" << dry.output;
        EXPECT_EQ(real_bytes, std::floor(real_bytes)) << kind << ": every step of the real run sends alike";
        total += dry_bytes;
      }
      EXPECT_EQ(sent.at("total"), total);
      const auto state = numbers(dry.output, "model state bytes", rank);
      const auto& real_state = summary["model_state_bytes"][rank];
      for (const char* part : {"params", "grads", "optimizer"}) {
        EXPECT_EQ(state.count(part) ? state.at(part) : -1, real_state[part].get<int64_t>())
            << part << ", rank " << rank << "\n" << dry.output;
      }
      const auto peak = numbers(dry.output, "planner peak bytes", rank);
      ASSERT_TRUE(peak.count("peak")) << dry.output;
      const double measured = summary["peak_tensor_bytes"][rank].get<double>();
      EXPECT_LE(std::abs(static_cast<double>(peak.at("peak")) - measured), 0.10 * measured)
          << "rank " << rank << ": predicted " << peak.at("peak") << ", measured " << measured;
    }
  }
}

TEST(DryRunTest, TwoRanksSendAndHoldWhatARealRunDoes) { expect_dry_run_matches_real_runs(2); }
TEST(DryRunTest, ThreeRanksSendAndHoldWhatARealRunDoes) { expect_dry_run_matches_real_runs(3); }
TEST(DryRunTest, FourRanksSendAndHoldWhatARealRunDoes) { expect_dry_run_matches_real_runs(4); }

TEST(DryRunTest, LlamaPresetsAtAThousandRanksHoldTheFormulasState) {
  // llama-3.1-8b, -70b and -405b under fsdp x 1024 (no layer is ever
  // allocated: a deferred Llama's matrices are meta from the start). Each
  // rank's state is FSDP's formula over the spec's counts: per unit, and for
  // the root, ceil(params / N) elements of fp32 parameters and gradients,
  // twice that of AdamW's moments.
  const int world = 1024;
  for (const std::string preset : {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"}) {
    SCOPED_TRACE(preset);
    const auto dry = run_gpt_binary("--preset " + preset + " --data " STRATA_SOURCE_DIR "/docs/design.md "
                                    "--block-size 1024 --batch-size 1 --strategy fsdp --nproc 1024 --dry-run");
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    const auto model = strata::recipes::llama_model(
        strata::recipes::llama_preset(preset).vocab_size(256).block_size(1024).max_position_embeddings(131072));
    const auto size = model->size();
    const int64_t root = size.params - size.units * size.unit_params;
    const int64_t elements = size.units * ((size.unit_params + world - 1) / world) + (root + world - 1) / world;
    for (int rank : {0, world - 1}) {
      const auto state = numbers(dry.output, "model state bytes", rank);
      ASSERT_FALSE(state.empty()) << dry.output;
      EXPECT_EQ(state.at("params"), 4 * elements) << "rank " << rank;
      EXPECT_EQ(state.at("grads"), 4 * elements) << "rank " << rank;
      EXPECT_EQ(state.at("optimizer"), 8 * elements) << "rank " << rank;
    }
  }
}

TEST(DryRunTest, TheHeaderNamesTheModelWithoutAPresetGiven) {
  // The default preset when none is given (the header once said "| |").
  const auto dry = run_gpt_binary("--data addition:2 --strategy fsdp --nproc 2 --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("strata-gpt --dry-run | gpt-micro | "), std::string::npos) << dry.output;
}

TEST(DryRunTest, ActivationCheckpointingRunsOnMetaTensors) {
  // Checkpointed blocks recompute on meta tensors too (asking autocast about
  // a meta tensor once threw "unknown device type for autocast").
  const auto dry = run_gpt_binary(flags("fsdp", 2) + " --activation-checkpointing 1 --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_FALSE(numbers(dry.output, "planner peak bytes", 0).empty()) << dry.output;
}

TEST(DryRunTest, RefusesToRunUnderALauncher) {
  const auto run = run_gpt_binary(flags("fsdp", 2) + " --dry-run", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "
                                  "LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("error: --dry-run simulates every rank in one process"), std::string::npos)
      << run.output;
}

}  // namespace
