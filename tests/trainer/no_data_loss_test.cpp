// no_data_loss_test - Bad input never costs the user a byte: strata-gpt and
// strata-bench refuse it with one line and exit 2 before they open anything
// for writing, so an existing output directory and every input file are
// byte-identical afterwards (and nothing new is created).
#include "tests/run_binary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
using strata::testing::BinaryRun;
using strata::testing::run_command;
using strata::testing::run_gpt_binary;

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("strata-no-data-loss-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Every file under `root` (recursively) with its bytes, and every directory.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string key = fs::relative(entry.path(), root).string();
    if (entry.is_directory()) {
      out[key + "/"] = "";
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    out[key] = bytes.str();
  }
  return out;
}

struct Case {
  Case(std::string a, std::string e, std::string v = "") : args(std::move(a)), expect(std::move(e)), env(std::move(v)) {}
  std::string args, expect, env;  ///< env: NAME=VALUE for the run, or ""
};

void expect_refused(const BinaryRun& run, const Case& c) {
  EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.output;
  EXPECT_NE(run.output.find(c.expect), std::string::npos) << c.args << "\n" << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << c.args << "\n" << run.output;
}

TEST(NoDataLossTest, BadInputAgainstAnExistingRunLeavesItByteIdentical) {
  const fs::path root = scratch("gpt");
  const fs::path out = root / "run";
  const std::string quick = " --batch-size 8 --log-every-n-steps 1 ";
  const auto first = run_gpt_binary("--preset gpt-nano --max-steps 4 --checkpoint-every 2 --val-check-interval 2 "
                                    "--limit-val-batches 1" + quick + "--output-dir " + out.string());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string step2 = (out / "checkpoints" / "step-2").string();
  ASSERT_TRUE(fs::is_directory(step2));
  { std::ofstream(root / "text.txt") << std::string(4000, 'a'); }
  { std::ofstream(root / "twice.ini") << "lr = 0.001\nlr = 0.002\n"; }
  const auto before = snapshot(root);
  const std::vector<Case> cases = {
      // --resume at what is not this model's checkpoint: checked against the
      // model before config.ini or summary.json are touched.
      {"--resume " + out.string(), "is not a complete strata checkpoint"},
      {"--resume " + step2 + " --preset gpt-micro", "does not match this model"},
      {"--resume " + step2 + " --data " + (root / "text.txt").string() + " --block-size 11",
       "does not match this model"},  // another vocabulary: 256 bytes, not 12
      {"--resume " + step2 + " --optimizer sgd", "holds adamw optimizer state but this run's optimizer is sgd"},
      // Values that were silently overridden, clamped or ignored.
      {"--lr 0.001 --lr 0.002", "--lr is given twice; give it once"},
      {"--config " + (root / "twice.ini").string(), "key 'lr' is given twice"},
      {"--comm-timeout 0.0004", "invalid value '0.0004' for --comm-timeout: must be >= 0.001 seconds"},
      {"--block-size 64", "--block-size would be ignored: addition data"},
      {"--vocab-size 300", "--vocab-size would be ignored: addition data"},
      {"--data " + (root / "text.txt").string() + " --vocab-size 300",
       "--vocab-size would be ignored: data '" + (root / "text.txt").string() + "' is not a token directory"},
      {"--lr 0.001 --min-lr 0.002", "--min-lr 0.002 is above --lr 0.001"},
      {"--warmup-steps 20", "--warmup-steps 20 is above --max-steps 8"},
      {"--early-stopping-patience 2 --limit-val-batches 0", "--early-stopping-patience 2 needs periodic validation"},
      {"--early-stopping-patience 2 --val-check-interval 0", "--early-stopping-patience 2 needs periodic validation"},
      // Found only after the whole run before.
      {"--export-weights /proc/strata-weights.bin", "cannot write --export-weights '/proc/strata-weights.bin'"},
      {"--export-weights " + (root / "missing" / "w.bin").string(), "does not exist"},
      // The launcher's rendezvous files need a usable TMPDIR.
      {"--strategy ddp --nproc 2", "TMPDIR '/proc/strata-tmp' cannot hold the launcher's rendezvous files",
       "TMPDIR=/proc/strata-tmp"},
  };
  for (const auto& c : cases) {
    // gpt-nano and one validation batch unless the case sets them itself.
    std::string args = "--max-steps 8" + quick + c.args;
    if (c.args.find("--preset") == std::string::npos) args += " --preset gpt-nano";
    if (c.args.find("--limit-val-batches") == std::string::npos) args += " --limit-val-batches 1";
    const auto run = run_gpt_binary(args + " --output-dir " + out.string(), c.env);
    expect_refused(run, c);
    EXPECT_TRUE(snapshot(root) == before) << c.args << ": the output directory or an input changed";
  }
}

#ifdef STRATA_BENCH_BINARY
BinaryRun run_bench(const std::string& args) { return run_command(std::string(STRATA_BENCH_BINARY) + " " + args); }

TEST(NoDataLossTest, StrataBenchNeverWritesOverItsInputs) {
  const fs::path root = scratch("bench");
  const fs::path out = root / "out";
  fs::create_directories(out);
  // The contents do not matter: the path checks come before any read.
  { std::ofstream(out / "runs.jsonl") << "{\"saved\": \"runs\"}\n"; }
  { std::ofstream(root / "baseline.jsonl") << "{\"saved\": \"baseline\"}\n"; }
  fs::create_directories(root / "full");
  { std::ofstream(root / "full" / "keep.txt") << "mine"; }
  const std::string runs = (out / "runs.jsonl").string(), baseline = (root / "baseline.jsonl").string();
  const auto before = snapshot(root);
  const std::vector<Case> cases = {
      {"--from-json " + runs + " --out " + out.string(), "--out would write '" + runs + "', which is the --from-json input"},
      {"--from-json " + runs + " --json " + runs, "--json would write '" + runs + "', which is the --from-json input"},
      {"--from-json " + runs + " --json " + (out / "." / "runs.jsonl").string(), "which is the --from-json input"},
      {"--baseline " + baseline + " --write-baseline " + baseline, "which is the --baseline input"},
      {"--json " + (root / "x.jsonl").string() + " --markdown " + (root / "x.jsonl").string(),
       "--markdown and --json both write"},
      {"--markdown /proc/strata.md", "--markdown '/proc/strata.md': directory '/proc' does not take new files"},
      {"--json " + (root / "missing" / "r.jsonl").string(), "does not exist"},
      {"--work-dir /proc/strata-work", "--work-dir '/proc/strata-work' cannot be created or written"},
      {"--out " + (root / "baseline.jsonl" / "sub").string(), "exists and is not a directory"},
      {"--suite checkpoint --presets gpt-nano,gpt-huge", "--presets: unknown preset 'gpt-huge'"},
      {"--suite checkpoint --dir " + (root / "full").string(), "must be a new or empty directory"},
      {"--suite checkpoint --json /proc/strata.jsonl", "--json '/proc/strata.jsonl' cannot be written"},
  };
  for (const auto& c : cases) {
    const auto run = run_bench(c.args);
    expect_refused(run, c);
    EXPECT_TRUE(snapshot(root) == before) << c.args << ": an input or output directory changed";
  }
}
#else
TEST(NoDataLossTest, StrataBenchNeverWritesOverItsInputs) {
  GTEST_SKIP() << "strata-bench is not built (STRATA_BUILD_BENCH off)";
}
#endif

}  // namespace
