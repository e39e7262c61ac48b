// llama_e2e_test - lit-gpt's scenario from one binary: strata-gpt fine-tunes a
// transformers checkpoint directory (a Qwen3 model transformers saved: grouped
// queries, q/k norms, tied head) given only as --init-from, under fsdp over 2
// ranks with every block checkpointed, as one process trains it; the export
// is a directory transformers loads, holding the trained weights.
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_gpt_binary;

constexpr const char* kPython = STRATA_PYTHON;

constexpr const char* kScript = R"PY(
import sys
import torch
import transformers

mode, out = sys.argv[1], sys.argv[2]
if mode == 'make':
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=128, tie_word_embeddings=True)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(out)
    # The tokenizer files a user's directory holds (a word-level one is enough).
    import tokenizers
    words = {'[UNK]': 0, 'the': 1, 'model': 2, 'strata': 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token='[UNK]'))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='[UNK]').save_pretrained(out)
else:  # compare: the export as transformers loads it, against the start
    trained = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    start = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[3]).state_dict()
    print('model_type=' + transformers.AutoConfig.from_pretrained(out).model_type)
    print('moved=%g' % max((trained[k] - start[k]).abs().max().item() for k in start))
    print('tensors=%d' % len(trained))
    print('tokens=' + ' '.join(str(i) for i in transformers.AutoTokenizer.from_pretrained(out)('the strata model x')['input_ids']))
)PY";

std::string common(const fs::path& from, const fs::path& out, const std::string& steps_lr = "4 --lr 0.1") {
  return "--init-from " + from.string() + " --data " STRATA_SOURCE_DIR "/README.md --block-size 32 --max-steps " +
         steps_lr + " --optimizer sgd --warmup-steps 0 --gradient-clip-val 0 --limit-val-batches 0 --progress-bar false "
         "--threads-per-rank 1 --output-dir " + out.string();
}

TEST(LlamaE2ETest, FineTunesATransformersDirectoryUnderFsdpWithCheckpointingAsOneProcessDoes) {
  strata::testing::TempDir dir;
  const fs::path hf = dir.path() / "qwen3";
  strata::testing::run_python(kPython, dir.path() / "hf.py", kScript, "make " + hf.string());
  ASSERT_TRUE(fs::exists(hf / "config.json"));
  const auto single = run_gpt_binary(common(hf, dir.path() / "single") + " --batch-size 8 --dump-params " +
                                     (dir.path() / "single.pt").string());
  ASSERT_EQ(single.exit_code, 0) << single.output;
  EXPECT_NE(single.output.find("strata-gpt | " + hf.string() + " | "), std::string::npos) << single.output;
  const auto fsdp = run_gpt_binary(common(hf, dir.path() / "fsdp") + " --strategy fsdp --nproc 2 --batch-size 4 "
                                   "--activation-checkpointing 1 --dump-params " + (dir.path() / "fsdp.pt").string() +
                                   " --export-weights " + (dir.path() / "export").string() + " --checkpoint-every 4");
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  const auto want = strata::testing::load_archive(dir.path() / "single.pt");
  const auto got = strata::testing::load_archive(dir.path() / "fsdp.pt");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) {
    EXPECT_LE((got.at(name) - tensor).abs().max().item<double>(), 1e-5) << name;
  }
  const auto seen = strata::testing::run_python(kPython, dir.path() / "hf.py", kScript,
                                                "compare " + (dir.path() / "export").string() + " " + hf.string());
  EXPECT_EQ(seen.at("model_type"), "qwen3");
  EXPECT_GT(std::stod(seen.at("moved")), 1e-3) << "the export holds trained weights";
  // Two layers of 11 tensors, the embedding and the final norm (the tied head is the embedding).
  EXPECT_EQ(std::stoi(seen.at("tensors")), 2 * 11 + 2 + 1) << "lm_head.weight as transformers ties it";
  EXPECT_EQ(seen.at("tokens"), "1 3 2 0") << "the directory's tokenizer, copied";
  // strata-export of the run's sharded checkpoint: the same directory.
  const auto cli = strata::testing::run_command(std::string(STRATA_EXPORT_BINARY) + " --format hf " +
                                                (dir.path() / "fsdp").string() + " " + (dir.path() / "cli").string());
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  const auto same = strata::testing::run_python(kPython, dir.path() / "hf.py", kScript,
                                                "compare " + (dir.path() / "cli").string() + " " +
                                                (dir.path() / "export").string());
  EXPECT_EQ(std::stod(same.at("moved")), 0.0) << "strata-export writes the weights the run exported";
  EXPECT_EQ(same.at("tokens"), "1 3 2 0");
  // The run started from the directory's weights: a step too small to move
  // them exports them as they were (a model initialised afresh would not).
  const auto still = run_gpt_binary(common(hf, dir.path() / "still", "1 --lr 1e-12") +
                                    " --strategy fsdp --nproc 2 --batch-size 4 --export-weights " + (dir.path() / "still-export").string());
  ASSERT_EQ(still.exit_code, 0) << still.output;
  const auto start = strata::testing::run_python(kPython, dir.path() / "hf.py", kScript,
                                                 "compare " + (dir.path() / "still-export").string() + " " + hf.string());
  EXPECT_LE(std::stod(start.at("moved")), 1e-9);
  // Its config.ini reruns it: the directory, not a preset, gives the model.
  const auto again = run_gpt_binary("--config " + (dir.path() / "still" / "config.ini").string() + " --output-dir " +
                                    (dir.path() / "again").string() + " --export-weights " +
                                    (dir.path() / "again-export").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const auto rerun = strata::testing::run_python(kPython, dir.path() / "hf.py", kScript,
                                                 "compare " + (dir.path() / "again-export").string() + " " + hf.string());
  EXPECT_LE(std::stod(rerun.at("moved")), 1e-9);
}

TEST(LlamaE2ETest, APresetOfAnotherFamilyOrAShapeFlagBesideTheDirectoryIsRefused) {
  strata::testing::TempDir dir;
  const fs::path hf = dir.path() / "qwen3";
  strata::testing::run_python(kPython, dir.path() / "hf.py", kScript, "make " + hf.string());
  for (const std::string extra : {" --preset gpt-nano", " --n-layer 3", " --bias false"}) {
    const auto run = run_gpt_binary(common(hf, dir.path() / "out") + extra);
    EXPECT_EQ(run.exit_code, 2) << extra << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << extra << ": one line\n" << run.output;
    EXPECT_FALSE(fs::exists(dir.path() / "out")) << extra;
  }
}

}  // namespace
