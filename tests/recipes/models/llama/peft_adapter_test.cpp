// peft_adapter_test - a LoRA adapter directory that PEFT itself saved starts a
// strata run (--init-from BASE --init-adapter DIR) and a generation
// (strata-generate BASE --adapter DIR) as the model PEFT merges from it:
// --eval-only's loss under fsdp x2 equals the merged directory's in one
// process, and greedy ids agree. PEFT is the oracle for the adapter's keys,
// layout and scale (lora_alpha / r, or / sqrt(r) under rsLoRA).
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_command;
using strata::testing::run_gpt_binary;

constexpr const char* kPython = STRATA_PYTHON;

constexpr const char* kScript = R"PY(
import sys
import torch
import transformers
import tokenizers
import peft

out, rslora = sys.argv[1], sys.argv[2] == 'rslora'
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
transformers.LlamaForCausalLM(cfg).save_pretrained(out + '/base')
words = {'[UNK]': 0, 'the': 1, 'model': 2, 'strata': 3, 'a': 4, 'and': 5, 'of': 6, 'to': 7}
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token='[UNK]'))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='[UNK]')
fast.save_pretrained(out + '/base')
# init_lora_weights=False: B random too, so the adapter changes the model.
config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=['q_proj', 'v_proj', 'down_proj'],
                         init_lora_weights=False, use_rslora=rslora)
model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(out + '/base'), config)
model.save_pretrained(out + '/adapter')
model.merge_and_unload().save_pretrained(out + '/merged')
fast.save_pretrained(out + '/merged')
)PY";

/// --eval-only's loss, from eval.json; the run must succeed.
double eval_loss(const std::string& args, const fs::path& out) {
  const auto run = run_gpt_binary(args + " --eval-only --block-size 32 --progress-bar false "
                                   "--threads-per-rank 1 --output-dir " + out.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(out / "eval.json");
  if (!in) return -1.0;
  const auto j = nlohmann::json::parse(in);
  EXPECT_GT(j.at("samples").get<int64_t>(), 6) << "more samples than one global batch of 3 x 2";
  EXPECT_NE(j.at("samples").get<int64_t>() % 6, 0) << "a last batch that wraps";
  return j.at("val_loss").get<double>();
}

std::string greedy_ids(const std::string& model) {
  const auto run = run_command(std::string(STRATA_GENERATE_BINARY) + " " + model +
                               " --prompt-ids '1 2 3 4' --ids --temperature 0 --max-new-tokens 16");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.output.substr(0, run.output.find('\n'));  // the ids; the speed follows
}

void expect_adapter_is_pefts_merge(const std::string& variant) {
  strata::testing::TempDir dir;
  strata::testing::run_python(kPython, dir.path() / "make_adapter.py", kScript, dir.path().string() + " " + variant);
  // 100 words: 68 windows of 32 tokens, so 4 of a last global batch of 6 would repeat.
  const fs::path text = dir.path() / "text.txt";
  {
    const char* words[] = {"the", "model", "strata", "a", "and", "of", "to", "unknown", "words"};
    std::ofstream out(text);
    for (int i = 0; i < 100; ++i) out << words[(i * 7 + i / 9) % 9] << (i % 12 == 11 ? "\n" : " ");
  }
  const std::string base = (dir.path() / "base").string(), adapter = (dir.path() / "adapter").string();
  const std::string data = " --data " + text.string() + " --tokenizer " + base;
  // One sample per batch in one process against 3 per rank on 2 ranks, whose
  // last batch wraps: --eval-only scores each sample once either way.
  const double plain = eval_loss("--init-from " + base + data + " --batch-size 1", dir.path() / "e-base");
  const double merged = eval_loss("--init-from " + (dir.path() / "merged").string() + data + " --batch-size 1",
                                  dir.path() / "e-merged");
  const double ours = eval_loss("--init-from " + base + " --init-adapter " + adapter + data +
                                    " --strategy fsdp --nproc 2 --batch-size 3",
                                dir.path() / "e-adapter");
  std::cout << "[ peft " << variant << " ] eval loss: base " << plain << ", PEFT's merge " << merged
            << ", base + adapter under fsdp x2 " << ours << "\n";
  EXPECT_GT(std::abs(merged - plain), 1e-3) << variant << ": the adapter changes the model";
  EXPECT_NEAR(ours, merged, 1e-5) << variant;
  EXPECT_EQ(greedy_ids(base + " --adapter " + adapter), greedy_ids((dir.path() / "merged").string())) << variant;
}

TEST(PeftAdapterTest, APeftSavedAdapterOnItsBaseIsPeftsMergedModel) { expect_adapter_is_pefts_merge("plain"); }

TEST(PeftAdapterTest, AnRsLoraAdapterScalesByAlphaOverTheRootOfTheRank) { expect_adapter_is_pefts_merge("rslora"); }

TEST(PeftAdapterTest, AnAdapterStrataCannotApplyIsOneLineAndNothingRuns) {
  strata::testing::TempDir dir;
  strata::testing::run_python(kPython, dir.path() / "make_adapter.py", kScript, dir.path().string() + " plain");
  const fs::path adapter = dir.path() / "adapter", base = dir.path() / "base";
  nlohmann::json config;
  std::ifstream(adapter / "adapter_config.json") >> config;
  const auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto c = config;
    c[key] = value;
    std::ofstream(adapter / "adapter_config.json") << c.dump();
  };
  const std::string args = "--data " + (base / "tokenizer.json").string() + " --tokenizer " + base.string() +
                           " --eval-only --block-size 16 --output-dir " + (dir.path() / "out").string();
  for (const auto& [key, value, named] :
       std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"use_dora", true, "'use_dora'"},
           {"bias", "all", "'bias'"},
           {"target_modules", nlohmann::json::array({"q_proj", "lm_head"}), "\"lm_head\""},
           {"peft_type", "IA3", "'peft_type'"}}) {
    with(key, value);
    const auto run = run_gpt_binary("--init-from " + base.string() + " --init-adapter " + adapter.string() + " " + args);
    EXPECT_EQ(run.exit_code, 2) << key << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << key << ": one line\n" << run.output;
    EXPECT_NE(run.output.find(named), std::string::npos) << key << run.output;
    EXPECT_FALSE(fs::exists(dir.path() / "out")) << key;
  }
  with("use_dora", false);
  const auto no_base = run_gpt_binary("--preset llama-nano --init-adapter " + adapter.string() + " " + args);
  EXPECT_EQ(no_base.exit_code, 2) << no_base.output;
  EXPECT_NE(no_base.output.find("needs --init-from"), std::string::npos) << no_base.output;
  const auto rank = run_gpt_binary("--init-from " + base.string() + " --init-adapter " + adapter.string() +
                                   " --lora-rank 8 " + args);
  EXPECT_EQ(rank.exit_code, 2) << rank.output;
  EXPECT_NE(rank.output.find("--lora-rank 8 differs"), std::string::npos) << rank.output;
}

}  // namespace
