// llama_e2e_test - lit-gpt's scenario from one binary: strata-gpt fine-tunes a
// transformers checkpoint directory (a Qwen3 model transformers saved: grouped
// queries, q/k norms, tied head) given only as --init-from, under fsdp over 2
// ranks with every block checkpointed, as one process trains it; the export
// is a directory transformers loads, holding the trained weights. LoRA on
// all seven projections under fsdp x2: the exported directory (adapters
// merged) gives in transformers the logits PEFT computes with the trained
// adapters beside the base model.
#include "strata/recipes/io/safetensors.h"
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

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
elif mode == 'large':  # 58M parameters in bf16, sharded as transformers shards (4 files of <= 40 MB)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128,
                                   tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, max_shard_size='40MB')
elif mode == 'peftdir':  # the merged export against PEFT loading strata's adapter directory onto the base
    import peft
    merged_dir, base, adapter_dir = out, sys.argv[3], sys.argv[4]
    pm = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), adapter_dir).eval()
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(2))
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    with torch.no_grad():
        want, got = pm(input_ids=ids).logits, merged(input_ids=ids).logits
        with pm.disable_adapter():
            bare = pm(input_ids=ids).logits
    print('diff=%.3g' % (want - got).abs().max().item())
    print('delta=%.3g' % (want - bare).abs().max().item())
    print('scale=%.3g' % want.abs().max().item())
    print('scale=%.3g' % want.abs().max().item())
elif mode == 'lora':  # the merged export against PEFT with the run's adapters on the base
    import peft
    from safetensors.torch import load_file
    base, adapters, alpha = sys.argv[3], load_file(sys.argv[4]), float(sys.argv[5])
    targets = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']
    pm = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base),
                             peft.LoraConfig(r=4, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets))
    loaded = 0
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if 'lora_' not in name:
                continue
            ours = name.replace('base_model.model.', '')
            ours = ours.replace('.lora_A.default.weight', '_lora.A').replace('.lora_B.default.weight', '_lora.B')
            p.copy_(adapters[ours])
            loaded += 1
    ids = torch.randint(0, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        want, got = pm.eval()(input_ids=ids).logits, merged(input_ids=ids).logits
        plain = transformers.AutoModelForCausalLM.from_pretrained(base).eval()(input_ids=ids).logits
    print('loaded=%d' % loaded)
    print('diff=%g' % (got - want).abs().max().item())
    print('delta=%g' % (want - plain).abs().max().item())
    print('scale=%g' % want.abs().max().item())
    print('scale=%g' % want.abs().max().item())
else:  # compare: the export as transformers loads it, against the start
    trained = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    start = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[3]).state_dict()
    print('model_type=' + transformers.AutoConfig.from_pretrained(out).model_type)
    print('moved=%g' % max((trained[k] - start[k]).abs().max().item() for k in start))
    print('tensors=%d' % len(trained))
    print('tokens=' + ' '.join(str(i) for i in transformers.AutoTokenizer.from_pretrained(out)('the strata model x')['input_ids']))
)PY";

/// The run's flags: the directory's model, and README.md as text, copied beside
/// the directory (its tokenizer tokenizes it into a cache beside the copy,
/// not in the source tree).
std::string common(const fs::path& from, const fs::path& out, const std::string& steps_lr = "4 --lr 0.1") {
  const fs::path text = from.parent_path() / "README.md";
  fs::copy_file(STRATA_SOURCE_DIR "/README.md", text, fs::copy_options::skip_existing);
  return "--init-from " + from.string() + " --data " + text.string() + " --block-size 32 --max-steps " +
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

TEST(LlamaE2ETest, LoraUnderFsdpExportsAMergedDirectoryWithPeftsLogits) {
  strata::testing::TempDir dir;
  const fs::path hf = dir.path() / "qwen3";
  strata::testing::run_python(kPython, dir.path() / "hf.py", kScript, "make " + hf.string());
  const auto run = run_gpt_binary(common(hf, dir.path() / "lora") + " --strategy fsdp --nproc 2 --batch-size 4 "
                                  "--lora-rank 4 --lora-alpha 16 --lora-targets all --checkpoint-every 4 --dump-params " +
                                  (dir.path() / "lora.pt").string() + " --export-weights " +
                                  (dir.path() / "export").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::map<std::string, torch::Tensor> adapters;
  for (const auto& [name, t] : strata::testing::load_archive(dir.path() / "lora.pt")) {
    if (name.find("_lora.") != std::string::npos) adapters[name] = t;
  }
  ASSERT_EQ(adapters.size(), 2u * 7u * 2u) << "A and B of seven projections in two blocks";
  strata::recipes::write_safetensors((dir.path() / "adapters.safetensors").string(), adapters);
  const auto seen = strata::testing::run_python(
      kPython, dir.path() / "hf.py", kScript,
      "lora " + (dir.path() / "export").string() + " " + hf.string() + " " + (dir.path() / "adapters.safetensors").string() +
          " 16");
  EXPECT_EQ(std::stoi(seen.at("loaded")), 28);
  EXPECT_GT(std::stod(seen.at("delta")), 1e-3) << "the trained adapters change the logits";
  // fp32 rounding of (W + s·BA)x against Wx + s·B(Ax) through two blocks is about 1e-5 of the logits (measured:
  // 3e-6 and 1.2e-5 of logits up to 1.3, AVX2 and AVX-512 differ); a merge 0.1% off in scale fails by 10x.
  const auto near = [](const std::map<std::string, std::string>& r) {
    return std::stod(r.at("diff")) / std::stod(r.at("scale"));
  };
  EXPECT_LT(near(seen), 1e-4) << "transformers on the merged export vs PEFT with the adapters: diff " << seen.at("diff")
                              << " of logits up to " << seen.at("scale");
  // strata-export --format peft: PEFT's own loader reads the adapters onto the base directory.
  const auto peft_export = strata::testing::run_command(std::string(STRATA_EXPORT_BINARY) + " --format peft " +
                                                        (dir.path() / "lora" / "checkpoints" / "step-4").string() + " " +
                                                        (dir.path() / "peft").string());
  ASSERT_EQ(peft_export.exit_code, 0) << peft_export.output;
  const auto peft = strata::testing::run_python(kPython, dir.path() / "hf.py", kScript,
                                                "peftdir " + (dir.path() / "export").string() + " " + hf.string() + " " +
                                                    (dir.path() / "peft").string());
  EXPECT_GT(std::stod(peft.at("delta")), 1e-3) << "the loaded adapters change the logits";
  EXPECT_LT(near(peft), 1e-4) << "PeftModel.from_pretrained(base, strata's adapters) vs the merged export: diff "
                              << peft.at("diff") << " of logits up to " << peft.at("scale");
  // The run itself as a model: strata-generate on its output directory, and
  // --eval-only resuming its checkpoint (--init-from's directory gives the
  // model, the checkpoint the weights), agree with the merged export.
  const auto ids = [](const std::string& model) {
    const auto run = strata::testing::run_command(std::string(STRATA_GENERATE_BINARY) + " " + model +
                                                  " --prompt-ids '1 2 3' --ids --temperature 0 --max-new-tokens 8");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return run.output.substr(0, run.output.find('\n'));
  };
  EXPECT_EQ(ids((dir.path() / "lora").string()), ids((dir.path() / "export").string()));
  const auto eval = [&](const std::string& args, const std::string& out) {
    const auto run = run_gpt_binary(args + " --eval-only --output-dir " + (dir.path() / out).string());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    std::ifstream in(dir.path() / out / "eval.json");
    return in ? nlohmann::json::parse(in).at("val_loss").get<double>() : -1.0;
  };
  const double resumed = eval("--config " + (dir.path() / "lora" / "config.ini").string() + " --resume auto", "lora");
  const double exported = eval("--init-from " + (dir.path() / "export").string() + " --data " +
                                    (dir.path() / "README.md").string() + " --block-size 32 --batch-size 3 "
                                    "--threads-per-rank 1 --progress-bar false",
                                "e-export");
  EXPECT_GT(resumed, 0.0);
  EXPECT_NEAR(resumed, exported, 1e-5);
  EXPECT_FALSE(fs::exists(dir.path() / "lora" / "summary.json") &&
               nlohmann::json::parse(std::ifstream(dir.path() / "lora" / "summary.json")).contains("eval_only"))
      << "--eval-only leaves the run's summary.json alone";
}

TEST(LlamaE2ETest, UnderFsdpEachRankReadsOnlyItsShardsOfAShardedBf16Directory) {
  // The load's peak on each rank (summary.json: the resident set size's rise
  // during setup) stays below what the rank must hold anyway, its fp32
  // parameter and gradient shards, plus the largest tensor, plus 10%. Reading
  // the whole directory on each rank (about 116 MB of bf16 here) or
  // materialising the root unit whole (embedding and head, 131 MB in fp32)
  // would exceed it.
  strata::testing::TempDir dir;
  const fs::path hf = dir.path() / "llama";
  strata::testing::run_python(kPython, dir.path() / "hf.py", kScript, "large " + hf.string());
  ASSERT_TRUE(fs::exists(hf / "model.safetensors.index.json")) << "sharded";
  const auto run = run_gpt_binary(common(hf, dir.path() / "out", "1") + " --strategy fsdp --nproc 2 --batch-size 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(dir.path() / "out" / "summary.json");
  const auto summary = nlohmann::json::parse(in);
  const int64_t largest = int64_t{32000} * 512 * 4;  // the embedding (and the head), fp32
  for (const auto& rank : summary["per_rank"]) {
    const int64_t before = rank["setup_rss_bytes"], peak = rank["setup_peak_rss_bytes"];
    if (peak < 0) GTEST_SKIP() << "the kernel refused to reset the peak RSS (/proc/self/clear_refs)";
    const int64_t shards = rank["memory"]["params"].get<int64_t>() + rank["memory"]["grads"].get<int64_t>();
    const double bound = 1.1 * double(shards + largest);
    std::cout << "[ llama load ] rank " << rank["rank"] << ": RSS rose " << (peak - before) / 1e6
              << " MB during setup; its shards " << shards / 1e6 << " MB, bound " << bound / 1e6 << " MB\n";
    EXPECT_GT(shards, 200'000'000) << "fp32 parameter and gradient shards of half of 58M parameters";
    EXPECT_LT(double(peak - before), bound) << "rank " << rank["rank"];
  }
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
