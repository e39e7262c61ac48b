// The fuzz targets over the committed corpus (tests/fuzz/corpus/<target>/:
// seeds from the upstream fixtures and what scripts/fuzz kept) and every
// input a finding was fixed with (tests/fuzz/findings/<target>/), in this
// build, without sanitizers: a regression of a fixed finding shows here as a
// broken contract, in seconds. scripts/fuzz is the sanitized, long run.
#include "tests/fuzz/fuzz_targets.h"

#include "strata/recipes/config/cli.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/llama/peft.h"
#include "tests/builtin_models.h"
#include "tests/builtin_strategies.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::fuzz {
namespace {

namespace fs = std::filesystem;
using testing::builtin_model_keys;
using testing::builtin_strategies;

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> out;
  for (const char* kind : {"corpus", "findings"}) {
    const fs::path dir = fs::path(STRATA_SOURCE_DIR) / "tests/fuzz" / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class FuzzReplayTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzReplayTest, EveryCorpusAndFindingInputIsReadOrRefusedInOneLineNamingTheFile) {
  const Target* target = find_target(GetParam());
  ASSERT_NE(target, nullptr);
  const auto inputs = inputs_of(target->name);
  // A target without inputs would pass vacuously: its seeds are committed.
  ASSERT_FALSE(inputs.empty()) << "no inputs under tests/fuzz/corpus/" << target->name;
  Workspace ws;
  int read = 0;
  for (const auto& path : inputs) {
    const Outcome outcome = target->run(bytes_of(path), ws);
    EXPECT_FALSE(outcome.broken.has_value()) << path << ": " << outcome.broken.value_or("");
    // The seeds are files users have (tests/fuzz/corpus/SOURCES.md): strata
    // reads them, except the ones named for what strata refuses.
    const std::string name = path.filename().string();
    if (name.rfind("seed-", 0) == 0 && name.find("refused") == std::string::npos) {
      EXPECT_EQ(outcome.refused, "") << path << " is a file users have, and strata refuses it";
    }
    read += outcome.refused.empty() && !outcome.broken;
  }
  EXPECT_GT(read, 0) << "the target read none of its inputs: it fuzzes only its refusals";
}

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& t : targets()) names.push_back(t.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplayTest, ::testing::ValuesIn(target_names()),
                         [](const auto& info) { return info.param; });

// What each target asserts can fail: anything but a one-line c10::Error naming the file.
TEST(FuzzContractTest, OnlyAOneLineErrorNamingTheFileKeepsTheContract) {
  const auto read = read_or_refused("/d/f.json", [] {});
  EXPECT_TRUE(!read.broken && read.refused.empty());
  const auto refused = read_or_refused("/d/f.json", [] { TORCH_CHECK_VALUE(false, "/d/f.json: bad 'x'"); });
  EXPECT_TRUE(!refused.broken && refused.refused == "/d/f.json: bad 'x'");
  EXPECT_TRUE(read_or_refused("/d/f.json", [] { TORCH_CHECK_VALUE(false, "bad 'x'"); }).broken);
  EXPECT_TRUE(read_or_refused("/d/f.json", [] { TORCH_CHECK(false, "/d/f.json:\nbad"); }).broken);
  EXPECT_TRUE(read_or_refused("/d/f.json", [] { throw std::out_of_range("/d/f.json"); }).broken);
  EXPECT_TRUE(read_or_refused("/d/f.json", [] { throw 1; }).broken);
  // Two readings: broken if either broke, read if either read.
  EXPECT_TRUE((refused | read).refused.empty());
  EXPECT_EQ((refused | refused).refused, "/d/f.json: bad 'x'");
  EXPECT_TRUE((read | Outcome{"x", ""}).broken);
}

// A file far larger than its kind ever is: refused in one line naming it,
// before a byte is read (the files are sparse: 300 MB claimed, none written).
TEST(HostileFileTest, ConfigsAndTokenizersOfHundredsOfMegabytesAreRefusedUnread) {
  Workspace ws;
  auto sparse = [&](const std::string& name) {
    const std::string path = ws.write(name, "{}");
    fs::resize_file(path, uint64_t{300} << 20);
    return path;
  };
  const std::string hf = ws.fresh_dir("hf"), peft = ws.fresh_dir("peft");
  const std::string config = sparse("hf/config.json"), adapter = sparse("peft/adapter_config.json");
  const std::string tokenizer = sparse("tokenizer.json");
  struct Case {
    std::string file;
    std::function<void()> read;
  };
  const std::vector<Case> cases{
      {config, [&] { (void)recipes::read_hf_llama_options(hf); }},
      {adapter, [&] { (void)recipes::read_peft_lora(peft); }},
      {tokenizer, [&] { (void)recipes::load_tokenizer(tokenizer); }},
  };
  for (const auto& c : cases) {
    const Outcome outcome = read_or_refused(c.file, c.read);
    EXPECT_FALSE(outcome.broken) << *outcome.broken;
    EXPECT_NE(outcome.refused.find("314572800 bytes"), std::string::npos) << outcome.refused;
  }
  for (const char* name : {"ds.json", "accelerate.yaml", "config.ini"}) {
    const std::string path = sparse(name);
    const auto result = recipes::parse_run_config({"strata-gpt", "--config", path}, builtin_model_keys(), builtin_strategies());
    EXPECT_EQ(result.exit_code, 2);
    EXPECT_NE(result.message.find(path), std::string::npos) << result.message;
    EXPECT_NE(result.message.find("314572800 bytes"), std::string::npos) << result.message;
  }
}

}  // namespace
}  // namespace strata::fuzz
