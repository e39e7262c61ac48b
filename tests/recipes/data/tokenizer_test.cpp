// tokenizer_test - strata's tokenizer.json (recipes/data/tokenizer) against
// the library users trust: the PyPI `tokenizers`, on real upstream files
// (tests/fixtures/tokenizers/SOURCES.md) and a corpus of more than 1 MB
// mixing scripts, code, emoji, combining marks and special tokens
// (tokenizer_oracle.py). strata-tokenize's ids, line by line and for the whole
// text, and its decoding must equal the library's byte for byte.
#include "tests/run_binary.h"
#include "tests/temp_dir.h"
#include "strata/recipes/data/prompt_style.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using strata::testing::run_command;

const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "tokenizers";
const fs::path kOracle = fs::path(STRATA_SOURCE_DIR) / "tests" / "recipes" / "data" / "tokenizer_oracle.py";
constexpr const char* kPython = STRATA_PYTHON;
constexpr const char* kTokenize = STRATA_TOKENIZE_BINARY;

/// The fixture directories holding a tokenizer.json, by name.
std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(kFixtures, ec)) {
    if (fs::exists(entry.path() / "tokenizer.json")) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The first line where `a` and `b` differ, with both ("" when equal).
std::string first_difference(const std::string& a, const std::string& b, const std::string& what) {
  if (a == b) return "";
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (size_t line = 1;; ++line) {
    const bool ga = bool(std::getline(sa, la)), gb = bool(std::getline(sb, lb));
    if (!ga && !gb) return what + ": differ in their final newline";
    if (la != lb || ga != gb) {
      return what + " line " + std::to_string(line) + ":\n  tokenizers: " + la.substr(0, 400) +
             "\n  strata:     " + lb.substr(0, 400);
    }
  }
}

/// The corpus (once per process) and the oracle's files for `tokenizer`.
class Oracle {
 public:
  static const fs::path& corpus() {
    static strata::testing::TempDir dir;
    static const fs::path path = [] {
      const fs::path p = dir.path() / "corpus.txt";
      const auto run = run_command(std::string(kPython) + " " + kOracle.string() + " corpus " + p.string() +
                                   " 1100000 2026");
      EXPECT_EQ(run.exit_code, 0) << run.output;
      return p;
    }();
    return path;
  }
  /// Runs the library (`mode`: encode for tokenizers, encode-tiktoken) on
  /// `tokenizer` into `out`; its round-trip count.
  static std::string encode(const fs::path& tokenizer, const fs::path& out, const std::string& mode = "encode") {
    const auto run = run_command(std::string(kPython) + " " + kOracle.string() + " " + mode + " " +
                                 tokenizer.string() + " " + corpus().string() + " " + out.string());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return run.output;
  }
};

/// strata-tokenize on `tokenizer`, line by line, whole and decoding the
/// oracle's ids, against the oracle's files in `dir`/hf.
void expect_same_as_oracle(const fs::path& tokenizer, const fs::path& dir, const std::string& name) {
  ASSERT_GE(fs::file_size(Oracle::corpus()), 1000000u);
  const std::string corpus = Oracle::corpus().string();
  const std::string tool = std::string(kTokenize) + " --tokenizer " + tokenizer.string();
  ASSERT_EQ(run_command(tool + " " + corpus + " > " + (dir / "lines.txt").string()).exit_code, 0);
  ASSERT_EQ(run_command(tool + " --whole " + corpus + " > " + (dir / "whole.txt").string()).exit_code, 0);
  ASSERT_EQ(run_command(tool + " --decode " + (dir / "hf" / "lines.txt").string() + " > " +
                        (dir / "decoded.txt").string()).exit_code, 0);
  for (const char* file : {"lines.txt", "whole.txt", "decoded.txt"}) {
    const std::string diff = first_difference(read_file(dir / "hf" / file), read_file(dir / file), file);
    EXPECT_TRUE(diff.empty()) << name << ": " << diff;
  }
}

bool have_tokenizers() {
  static const bool ok = run_command(std::string(kPython) + " -c 'import tokenizers'").exit_code == 0;
  return ok;
}

class TokenizerParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParityTest, IdsAndDecodingEqualTheTokenizersLibrary) {
  if (!have_tokenizers()) GTEST_SKIP() << "'" << kPython << "' cannot import tokenizers: run scripts/setup";
  strata::testing::TempDir dir;
  const std::string roundtrip = Oracle::encode(kFixtures / GetParam() / "tokenizer.json", dir.path() / "hf");
  expect_same_as_oracle(kFixtures / GetParam() / "tokenizer.json", dir.path(), GetParam());
  std::cout << GetParam() << ": " << roundtrip;  // how many lines decode to themselves, in both
}

TEST(TiktokenParityTest, Llama3OriginalTokenizerModelGivesTiktokensIds) {
  // Meta's original tokenizer.model (a tiktoken BPE file), read with Llama 3's
  // pattern and special tokens; the oracle is tiktoken itself. The directory
  // holds no tokenizer.json, so strata finds the .model in it.
  if (run_command(std::string(kPython) + " -c 'import tiktoken'").exit_code != 0)
    GTEST_SKIP() << "'" << kPython << "' cannot import tiktoken: run scripts/setup";
  strata::testing::TempDir dir;
  const fs::path model_dir = kFixtures / "llama3-tiktoken";
  ASSERT_FALSE(fs::exists(model_dir / "tokenizer.json"));
  const std::string roundtrip = Oracle::encode(model_dir / "tokenizer.model", dir.path() / "hf", "encode-tiktoken");
  expect_same_as_oracle(model_dir, dir.path(), "llama3-tiktoken");
  std::cout << "llama3-tiktoken: " << roundtrip;
  // The same ids as Llama 3's tokenizer.json where both name the tokens alike.
  const auto tiktoken = strata::recipes::load_tokenizer(model_dir.string());
  const auto hf = strata::recipes::load_tokenizer((kFixtures / "llama3").string());
  const std::string text = "<|begin_of_text|>Hello world, 12345 中文 👍🏽<|eot_id|>";
  EXPECT_EQ(tiktoken->encode(text, true), hf->encode(text, true));
  EXPECT_EQ(tiktoken->vocab_size(), 128256);
}

INSTANTIATE_TEST_SUITE_P(Upstream, TokenizerParityTest, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(TokenizerFixturesTest, SixFamiliesFromUpstream) {
  // GPT-2, Llama 3, Qwen, TinyLlama/Llama 2, Mistral, SmolLM2/Phi-3 (the issue's six).
  EXPECT_GE(fixture_names().size(), 6u) << "tests/fixtures/tokenizers/ lost a tokenizer";
  EXPECT_TRUE(fs::exists(kFixtures / "SOURCES.md"));
}

/// `fixture`'s tokenizer.json with `edit` applied, written to `dir`.
fs::path edited(const std::string& fixture, const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_file(kFixtures / fixture / "tokenizer.json"));
  edit(j);
  const fs::path out = dir / (fixture + "-edited.json");
  std::ofstream(out) << j.dump();
  return out;
}

TEST(TokenizerDefectTest, AWrongRegexOrNoByteFallbackGivesOtherIds) {
  // The checks above would catch either: the same text, the real file's ids
  // against an edited file's.
  strata::testing::TempDir dir;
  const std::string text = "year 2024: 中文 👍🏽 and 1234567";
  const auto real = strata::recipes::load_tokenizer((kFixtures / "llama3").string());
  const auto greedy_digits = strata::recipes::load_tokenizer(edited("llama3", dir.path(), [](nlohmann::json& j) {
    auto& split = j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
    const std::string pattern = split.get<std::string>();
    const size_t at = pattern.find("\\p{N}{1,3}");
    ASSERT_NE(at, std::string::npos) << pattern;
    split = pattern.substr(0, at) + "\\p{N}+" + pattern.substr(at + 10);
  }).string());
  EXPECT_NE(real->encode(text), greedy_digits->encode(text)) << "Llama 3 splits digits in threes";
  const auto sp = strata::recipes::load_tokenizer((kFixtures / "tinyllama").string());
  const auto no_fallback = strata::recipes::load_tokenizer(
      edited("tinyllama", dir.path(), [](nlohmann::json& j) { j["model"]["byte_fallback"] = false; }).string());
  const auto with = sp->encode(text), without = no_fallback->encode(text);
  EXPECT_NE(with, without);
  const int32_t unk = *sp->token_to_id("<unk>");
  EXPECT_EQ(std::count(with.begin(), with.end(), unk), 0) << "byte fallback: no unknown token";
  EXPECT_GT(std::count(without.begin(), without.end(), unk), 0);
}

TEST(TokenizerBadFileTest, OneLineNamingTheFileExitTwoNothingOnStdout) {
  strata::testing::TempDir dir;
  const fs::path text = dir.path() / "text.txt";
  std::ofstream(text) << "hello\n";
  const fs::path stdout_file = dir.path() / "stdout.txt";
  auto expect_refused = [&](const fs::path& tokenizer, const std::string& expected) {
    // stdout to a file, stderr (run_command folds it in) to the output.
    const auto run = run_command("{ " + std::string(kTokenize) + " --tokenizer " + tokenizer.string() + " " +
                                 text.string() + " > " + stdout_file.string() + "; }");
    EXPECT_EQ(run.exit_code, 2) << tokenizer;
    EXPECT_EQ(fs::file_size(stdout_file), 0u) << "nothing on stdout: " << read_file(stdout_file);
    EXPECT_NE(run.output.find(expected), std::string::npos) << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  };
  const std::string real = read_file(kFixtures / "gpt2" / "tokenizer.json");
  const fs::path truncated = dir.path() / "truncated.json";
  std::ofstream(truncated) << real.substr(0, real.size() / 2);
  expect_refused(truncated, "truncated.json' is not JSON");
  expect_refused(edited("gpt2", dir.path(), [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }),
                 "model type 'Unigram' is not supported; supported: BPE, WordLevel");
  expect_refused(edited("gpt2", dir.path(), [](nlohmann::json& j) { j["model"]["merges"][0] = "Ġ t h"; }),
                 "a merge is not \"a b\": 'Ġ t h'");
  expect_refused(dir.path() / "missing", "missing': no such file");
  // A tiktoken file: its line; a SentencePiece model: what to give instead.
  const fs::path tiktoken = dir.path() / "tokenizer.model";
  std::ofstream(tiktoken) << "IQ== 0\nIg== 1\nnot-base64! 2\n";
  expect_refused(tiktoken, "tokenizer.model': line 3 is not \"<base64 bytes> <rank>\": 'not-base64! 2'");
  std::ofstream(tiktoken) << "IQ== 0\nIg== 5\n";
  expect_refused(tiktoken, "line 2: rank 5 where 1 was expected");
  std::ofstream(tiktoken, std::ios::binary) << std::string("\x0a\x0e\x0a\x05<unk>\x15\x00\x00\x00\x00\x18\x02", 16);
  expect_refused(tiktoken, "a SentencePiece model, which strata does not read");
  fs::create_directory(dir.path() / "empty");
  expect_refused(dir.path() / "empty", "the directory has no tokenizer.json or tokenizer.model");
  // A text that is not UTF-8: its line and byte.
  std::ofstream(text) << "fine\nbad \xff byte\n";
  const auto bad = run_command(std::string(kTokenize) + " --tokenizer " + (kFixtures / "gpt2").string() + " " +
                               text.string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("line 2: text is not UTF-8: byte 4"), std::string::npos) << bad.output;
}

}  // namespace

namespace {

TEST(TokenizedDataRunTest, ABadRecordIsOneLineExitTwoAndNothingWritten) {
  // strata-gpt tokenizes only after every other check: a bad record stops it
  // before an output directory or a cache exists.
  strata::testing::TempDir dir;
  const fs::path data = dir.path() / "records.jsonl";
  std::ofstream(data) << "{\"text\": \"fine\"}\n{\"instruction\": \"no text\"}\n";
  const auto run = strata::testing::run_gpt_binary("--data " + data.string() + " --tokenizer " +
                                                   (kFixtures / "gpt2").string() + " --preset gpt-nano --output-dir " +
                                                   (dir.path() / "out").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("records.jsonl' line 2: expected an object with a \"text\" string"), std::string::npos)
      << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  EXPECT_FALSE(fs::exists(dir.path() / "out"));
  EXPECT_FALSE(fs::exists(dir.path() / "records.jsonl.strata-tokens"));
}

}  // namespace

namespace {

constexpr const char* kTemplateScript = R"PY(
import json, sys, transformers
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
for conversation in json.load(open(sys.argv[2])):
    print('rendered=' + json.dumps(tok.apply_chat_template(conversation, tokenize=False)))
    asking = conversation[:-1]  # up to the last user turn, the answer to come
    # enable_thinking=False: Qwen3's prompt for an answer without thinking (other templates ignore it).
    print('asking=' + json.dumps(tok.apply_chat_template(asking, tokenize=False, add_generation_prompt=True,
                                                         enable_thinking=False)))
)PY";

TEST(PromptStyleTest, RendersConversationsAsTheModelsChatTemplateDoes) {
  // transformers' apply_chat_template on the fixture's own tokenizer_config.json
  // is the oracle; strata picks the style from the same file.
  if (!have_tokenizers()) GTEST_SKIP() << "'" << kPython << "' cannot import tokenizers: run scripts/setup";
  strata::testing::TempDir dir;
  const std::vector<std::vector<strata::recipes::ChatMessage>> conversations = {
      {{"user", "What is 2 + 3?"}, {"assistant", "5"}},
      {{"system", "You are terse."}, {"user", "Name a colour."}, {"assistant", "Blue."},
       {"user", "Another?"}, {"assistant", "Red."}},
  };
  nlohmann::json all = nlohmann::json::array();
  for (const auto& c : conversations) {
    nlohmann::json turns = nlohmann::json::array();
    for (const auto& m : c) turns.push_back({{"role", m.role}, {"content", m.content}});
    all.push_back(turns);
  }
  std::ofstream(dir.path() / "conversations.json") << all.dump();
  for (const std::string fixture : {"tinyllama", "phi3", "qwen3"}) {
    const auto style = strata::recipes::make_prompt_style(strata::recipes::prompt_style_for((kFixtures / fixture).string()));
    if (!fs::exists(dir.path() / "render.py")) std::ofstream(dir.path() / "render.py") << kTemplateScript;
    const auto run = run_command(std::string(kPython) + " " + (dir.path() / "render.py").string() + " " +
                                 (kFixtures / fixture).string() + " " + (dir.path() / "conversations.json").string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::istringstream lines(run.output);
    size_t i = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("asking=", 0) == 0) {
        // strata-generate --chat: the turns so far and the assistant's opening.
        auto asking = conversations.at(i - 1);
        asking.pop_back();
        EXPECT_EQ(style->generation_prompt(asking), nlohmann::json::parse(line.substr(7)).get<std::string>())
            << fixture << " (" << style->name() << ") generation prompt " << i;
        continue;
      }
      if (line.rfind("rendered=", 0) != 0) continue;
      const std::string want = nlohmann::json::parse(line.substr(9)).get<std::string>();
      strata::recipes::InstructRecord record;
      record.messages = conversations.at(i++);
      std::string got;
      for (const auto& seg : style->render(record)) got += seg.text;
      EXPECT_EQ(got, want) << fixture << " (" << style->name() << ") conversation " << i;
    }
    EXPECT_EQ(i, conversations.size()) << run.output;
  }
}

}  // namespace
