// generate_test - strata-generate (recipes/app/generate.h) against
// transformers' generate(): on a small random Llama that transformers saved,
// and on a strata-gpt GPT run, whose GPT-2 export transformers loads.
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace {

namespace fs = std::filesystem;
using strata::testing::run_command;

constexpr const char* kPython = STRATA_PYTHON;
constexpr const char* kGenerate = STRATA_GENERATE_BINARY;
constexpr const char* kGpt = STRATA_GPT_BINARY;
constexpr const char* kExport = STRATA_EXPORT_BINARY;
constexpr const char* kPrompt = "1 17 300 42 99 7";

constexpr const char* kScript = R"PY(
import sys, time, torch, transformers
out = sys.argv[1]
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0,
    tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
model = transformers.LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    for p in model.parameters():
        p.mul_(8.0)  # peaked logits: no near-ties for greedy to break differently
model.save_pretrained(out)
prompt = torch.tensor([[int(i) for i in sys.argv[2].split()]])
model.generate(prompt, do_sample=False, max_new_tokens=4, pad_token_id=0)  # warm-up
start = time.perf_counter()
ids = model.generate(prompt, do_sample=False, max_new_tokens=64, pad_token_id=0)
seconds = time.perf_counter() - start
new = ids[0, prompt.shape[1]:].tolist()
print('ids=' + ' '.join(map(str, new)))
print('tokens_per_s=%.1f' % (len(new) / seconds))
)PY";

std::string generate(const fs::path& model, const std::string& flags) {
  const auto run = run_command(std::string(kGenerate) + " " + model.string() + " --prompt-ids '" + kPrompt +
                               "' --ids " + flags + " 2>/dev/null");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.output.substr(0, run.output.find('\n'));
}

TEST(GenerateTest, GreedyIsTransformersGenerateAndSamplingFollowsTheSeed) {
  strata::testing::TempDir dir;
  const fs::path model = dir.path() / "llama";
  auto hf = strata::testing::run_python(kPython, dir.path() / "make.py", kScript, model.string() + " '" + kPrompt + "'");
  ASSERT_TRUE(hf.count("ids")) << "transformers did not run";
  EXPECT_EQ(generate(model, "--max-new-tokens 64 --temperature 0"), hf.at("ids")) << "64 greedy tokens";
  const auto timed = run_command(std::string(kGenerate) + " " + model.string() + " --prompt-ids '" + kPrompt +
                                 "' --ids --max-new-tokens 64 --temperature 0");
  std::cout << "transformers generate: " << hf.at("tokens_per_s") << " tokens/s; strata-generate: "
            << timed.output.substr(timed.output.find("prompt ")) << std::flush;
  const std::string a = generate(model, "--temperature 0.9 --top-k 40 --seed 5");
  EXPECT_EQ(generate(model, "--temperature 0.9 --top-k 40 --seed 5"), a) << "a fixed seed samples the same";
  EXPECT_NE(generate(model, "--temperature 0.9 --top-k 40 --seed 6"), a) << "another seed samples otherwise";
  const auto bad = run_command(std::string(kGenerate) + " " + (dir.path() / "none").string() + " --prompt-ids 1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(std::count(bad.output.begin(), bad.output.end(), '\n'), 1) << bad.output;
}

constexpr const char* kGpt2Script = R"PY(
import sys, torch, transformers
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
prompt = torch.tensor([[int(i) for i in sys.argv[2].split()]])
ids = model.generate(prompt, do_sample=False, max_new_tokens=64, pad_token_id=0, eos_token_id=50256)
print('ids=' + ' '.join(map(str, ids[0, prompt.shape[1]:].tolist())))
)PY";

TEST(GenerateTest, AGptRunGeneratesWhatTransformersGpt2GeneratesFromItsExport) {
  // strata's own GPT, trained by strata-gpt on text through GPT-2's
  // tokenizer: strata-generate on the run directory (KV-cached, the run's
  // tokenizer) against transformers' GPT2LMHeadModel on its export.
  strata::testing::TempDir dir;
  const fs::path run = dir.path() / "run", hf = dir.path() / "hf";
  const std::string src = STRATA_SOURCE_DIR;
  // --init-std 0.2: peaked logits, so greedy has no near-ties to break otherwise.
  const auto train = run_command(std::string(kGpt) + " --data " + src + "/README.md --tokenizer " + src +
                                 "/tests/fixtures/tokenizers/gpt2 --preset gpt-nano --block-size 96 --batch-size 4 "
                                 "--max-steps 2 --init-std 0.2 --checkpoint-every 2 --output-dir " + run.string());
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const auto exported = run_command(std::string(kExport) + " --format hf " + run.string() + " " + hf.string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  auto oracle = strata::testing::run_python(kPython, dir.path() / "gpt2.py", kGpt2Script,
                                            hf.string() + " '" + kPrompt + "'");
  ASSERT_TRUE(oracle.count("ids")) << "transformers did not run";
  EXPECT_EQ(generate(run, "--max-new-tokens 64 --temperature 0"), oracle.at("ids")) << "64 greedy tokens";
  // A text prompt through the run's tokenizer; past the 96 learned positions: one line, nothing on stdout.
  const auto text = run_command(std::string(kGenerate) + " " + run.string() +
                                " --prompt 'The strategy' --max-new-tokens 8 --temperature 0 2>/dev/null");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_FALSE(text.output.empty());
  const auto too_long = run_command("{ " + std::string(kGenerate) + " " + run.string() +
                                    " --prompt 'The strategy' --max-new-tokens 95 > " + (dir.path() / "out").string() +
                                    "; }");
  EXPECT_EQ(too_long.exit_code, 2) << too_long.output;
  EXPECT_NE(too_long.output.find("exceed the model's context of 96 positions"), std::string::npos) << too_long.output;
  EXPECT_EQ(fs::file_size(dir.path() / "out"), 0u);
}

}  // namespace
