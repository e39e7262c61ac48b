// safetensors_test - Hugging Face interop (recipes/io/safetensors.h,
// recipes/models/gpt/hf_gpt2.h): the file format round-trips and refuses bad headers;
// strata-export --format safetensors gives a directory that transformers'
// GPT2LMHeadModel loads with strata's logits (the `transformers` package from
// PyPI, installed by scripts/setup, is the oracle); --init-from reads such a
// directory, one written by transformers itself included.
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"
#include "strata/recipes/data/data.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/gpt/hf_gpt2.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/io/safetensors.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iostream>
#include <sstream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_command;
using strata::testing::first_logged_loss;
using strata::testing::run_gpt_binary;
using strata::testing::save_dict;

constexpr const char* kPython = STRATA_PYTHON;

constexpr const char* kScript = R"PY(
import sys, json
import torch
from transformers import GPT2Config, GPT2LMHeadModel

cmd, a = sys.argv[1], sys.argv[2:]
b = torch.load(a[1], weights_only=False)   # the test's batch (a typed C++ dict)
if cmd == 'logits':        # hf_dir batch: max |HF logits - strata logits|
    m = GPT2LMHeadModel.from_pretrained(a[0]).eval()
    with torch.no_grad():
        got = m(b['input']).logits
    print('maxdiff=%.3e' % (got - b['logits']).abs().max().item())
    print('scale=%.3e' % b['logits'].abs().max().item())
elif cmd == 'write':       # hf_dir batch n_layer n_head n_embd vocab block activation: a random GPT-2, its loss
    from transformers.activations import ACT2FN
    torch.manual_seed(0)
    c = GPT2Config(n_layer=int(a[2]), n_head=int(a[3]), n_embd=int(a[4]), vocab_size=int(a[5]),
                   n_positions=int(a[6]), activation_function=a[7], resid_pdrop=0.0, embd_pdrop=0.0,
                   attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    m = GPT2LMHeadModel(c).eval()
    with torch.no_grad():   # pre-activations of order 1 and large logits, where GELU and its tanh form differ
        m.transformer.wte.weight.mul_(20)
        for block in m.transformer.h:
            block.mlp.c_fc.weight.mul_(40)
            block.mlp.c_proj.weight.mul_(50)
    m.save_pretrained(a[0])
    m.transformer.save_pretrained(a[0] + '-base')   # a GPT2Model, as the hub's "gpt2": no "transformer." prefix
    def loss_of(model):
        with torch.no_grad():
            logits = model(b['input']).logits
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), b['target'].reshape(-1),
                                                     ignore_index=-1).item()
    print('loss=%.10f' % loss_of(m))
    with torch.no_grad():
        logits = m(b['input']).logits
        other = 'gelu_new' if a[7] == 'gelu' else 'gelu'
        for block in m.transformer.h:
            block.mlp.act = ACT2FN[other]
        other_logits = m(b['input']).logits   # the control: the other GELU
    torch.save({'logits': logits, 'other': other_logits}, a[0] + '-logits.pt')
)PY";

std::map<std::string, std::string> python(const fs::path& dir, const std::string& args) {
  return strata::testing::run_python(kPython, dir / "hf.py", kScript, args);
}

bool have_transformers() {
  static const bool ok = run_command(std::string(kPython) + " -c 'import transformers'").exit_code == 0;
  return ok;
}
#define REQUIRE_TRANSFORMERS()                                                                             \
  if (!have_transformers())                                                                                \
  GTEST_SKIP() << "'" << kPython << "' cannot import transformers (STRATA_PYTHON): run scripts/setup"

std::string flags(const fs::path& out) {
  return "--preset gpt-nano --data addition:2 --log-every-n-steps 1 --limit-val-batches 1 --threads-per-rank 1 "
         "--progress-bar false --output-dir " + out.string();
}

TEST(SafetensorsTest, RoundTripsAndRefusesBadFiles) {
  strata::testing::TempDir dir("strata-safetensors");
  const std::map<std::string, torch::Tensor> tensors = {
      {"a", torch::randn({3, 4})}, {"b", torch::randn({5}).to(torch::kBFloat16)},
      {"c", torch::randn({2, 2}).to(torch::kHalf).t()}, {"empty", torch::zeros({0, 3})}};
  const auto path = dir.file("t.safetensors");
  strata::recipes::write_safetensors(path, tensors);
  const auto back = strata::recipes::read_safetensors(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(back.at(name), t.contiguous())) << name;
  // Bad files: each one line naming what is wrong.
  std::ifstream in(path, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto refused = [&](const std::string& bytes, const std::string& part) {
    std::ofstream(dir.file("bad.safetensors"), std::ios::binary) << bytes;
    try {
      strata::recipes::read_safetensors(dir.file("bad.safetensors"));
      ADD_FAILURE() << "accepted; expected '" << part << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(part), std::string::npos) << e.what_without_backtrace();
    }
  };
  refused(good.substr(0, 5), "shorter than its 8-byte header length");
  refused(good.substr(0, 40), "exceeds the file");
  refused(good.substr(0, good.size() - 2), "do not hold");
  refused(good + "xx", "2 data bytes belong to no tensor");
  std::string bf = good;
  bf.replace(bf.find("\"BF16\""), 6, "\"Q4\"  ");
  refused(bf, "dtype \"Q4\" is not supported");
  // Sizes whose product overflows are refused, not wrapped.
  std::string big = good;
  const auto shape = big.find("[5]");
  ASSERT_NE(shape, std::string::npos);
  big.replace(shape, 3, "[4611686018427387904,4]");
  uint64_t old_header = 0;
  for (int i = 7; i >= 0; --i) old_header = (old_header << 8) | static_cast<unsigned char>(good[i]);
  const uint64_t n = big.size() - good.size() + old_header;  // the data keeps its size
  for (int i = 0; i < 8; ++i) big[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  refused(big, "do not hold the bytes of shape [4611686018427387904,4]");
  // A header of 150 MB (a sparse file: no disk used) is refused at its
  // length, before its bytes are read or parsed.
  {
    const auto huge = dir.file("huge.safetensors");
    std::string length(8, '\0');
    const uint64_t claimed = 150'000'000;
    for (int i = 0; i < 8; ++i) length[size_t(i)] = static_cast<char>((claimed >> (8 * i)) & 0xff);
    std::ofstream(huge, std::ios::binary) << length;
    std::filesystem::resize_file(huge, 8 + claimed);
    try {
      strata::recipes::read_safetensors(huge);
      ADD_FAILURE() << "a 150 MB header was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find("header length 150000000 exceeds the 100000000-byte limit"),
                std::string::npos)
          << e.what_without_backtrace();
    }
  }
}

TEST(HfGpt2Test, TransformersLoadsTheExportWithStrataLogitsAndInitFromReadsItBack) {
  REQUIRE_TRANSFORMERS();
  strata::testing::TempDir dir("strata-hf");
  for (const std::string& lora :
       {std::string(""), std::string(" --lora-rank 4 --lora-targets attn,mlp"), std::string(" --activation gelu_new")}) {
    SCOPED_TRACE(lora);
    const fs::path run = dir.path() / ("run" + std::to_string(lora.size()));
    auto trained = run_gpt_binary(flags(run) + " --max-steps 4 --lr 1e-2 --checkpoint-every 4 --dump-params " +
                                  (run.string() + ".dump") + lora);
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const fs::path hf = run.string() + "-hf", pt = run.string() + ".pt";
    // A step directory and an output directory, written with trailing slashes
    // as a shell completes them: config.ini is still found, OUT still made.
    auto exported = run_command(std::string(STRATA_EXPORT_BINARY) + " --format safetensors " +
                                (run / "checkpoints" / "step-4").string() + "/ " + hf.string() + "/");
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    exported = run_command(std::string(STRATA_EXPORT_BINARY) + " " + run.string() + " " + pt.string());
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
    std::ifstream config_in(hf / "config.json");
    const std::string config((std::istreambuf_iterator<char>(config_in)), std::istreambuf_iterator<char>());
    const std::string activation = lora.find("gelu_new") != std::string::npos ? "gelu_new" : "gelu";
    EXPECT_NE(config.find("\"activation_function\": \"" + activation + "\""), std::string::npos) << config;
    EXPECT_NE(config.find("\"n_head\": 3"), std::string::npos) << config;
    // strata's logits, from the trained parameters (adapters unmerged).
    auto data = strata::recipes::make_data("addition:2", 0, 50257, 1337);
    auto options = strata::recipes::gpt_preset("gpt-nano").vocab_size(data->vocab_size()).block_size(data->block_size());
    if (lora.find("lora") != std::string::npos) options.lora_rank(4).lora_targets("attn,mlp");
    if (lora.find("gelu_new") != std::string::npos) options.activation("gelu_new");
    strata::recipes::GPTModule module(options);
    const auto dumped = strata::testing::load_archive(run.string() + ".dump");
    {
      torch::NoGradGuard no_grad;
      for (auto& item : module.module().named_parameters()) item.value().copy_(dumped.at(item.key()));
    }
    module.module().eval();
    const auto batch = data->val_batch(0, 8, strata::ShardInfo{});
    torch::Tensor logits;
    {
      torch::NoGradGuard no_grad;
      logits = module.model()->forward(batch.input);
    }
    save_dict(dir.path() / "batch.pt", {{"input", batch.input}, {"logits", logits}});
    auto py = python(dir.path(), "logits " + hf.string() + " " + (dir.path() / "batch.pt").string());
    ASSERT_TRUE(py.count("maxdiff"));
    std::cout << "[ hf gpt2 ]" << lora << ": max |transformers - strata| logits " << py["maxdiff"] << " (max |logit| "
              << py["scale"] << ")" << std::endl;
    // fp32 rounding grows with the logits (the width-scaled init made them larger): relative to
    // the largest. The issue asks 1e-4; measured 1.03e-6 at max |logit| 1.93 (LoRA merged).
    EXPECT_LE(std::stod(py["maxdiff"]), 1e-6 * std::max(1.0, std::stod(py["scale"])));
    // Back: --init-from the directory starts where --init-from the .pt export does.
    double first[2];
    int i = 0;
    for (const auto& from : {hf, pt}) {
      const fs::path next = run.string() + "-from-" + std::to_string(i);
      auto again = run_gpt_binary(flags(next) + " --max-steps 1 --activation " + activation + " --init-from " +
                                  from.string());
      ASSERT_EQ(again.exit_code, 0) << again.output;
      first[i++] = first_logged_loss(next / "metrics.csv");
    }
    EXPECT_EQ(first[0], first[1]);
  }
}

TEST(HfGpt2Test, InitFromADirectoryTransformersWrote) {
  REQUIRE_TRANSFORMERS();
  strata::testing::TempDir dir("strata-hf-init");
  auto data = strata::recipes::make_data("addition:2", 0, 50257, 1337);
  const auto batch = data->train_batch(0, 8, strata::ShardInfo{});
  save_dict(dir.path() / "batch.pt", {{"input", batch.input}, {"target", batch.target}});
  for (const std::string activation : {"gelu", "gelu_new"}) {
    SCOPED_TRACE(activation);
    const fs::path hf = dir.path() / ("hf-" + activation);
    // gpt-nano: 3 layers, 3 heads, 48 wide.
    auto py = python(dir.path(), "write " + hf.string() + " " + (dir.path() / "batch.pt").string() + " 3 3 48 " +
                                     std::to_string(data->vocab_size()) + " " + std::to_string(data->block_size()) +
                                     " " + activation);
    ASSERT_TRUE(py.count("loss"));
    // Logits in this process from the directory: transformers' own, and
    // (the control) far from those of the other GELU.
    auto options = strata::recipes::gpt_preset("gpt-nano").vocab_size(data->vocab_size())
                       .block_size(data->block_size()).activation(activation);
    strata::recipes::GPTModule module(options);
    {
      torch::NoGradGuard no_grad;
      const auto weights = strata::recipes::from_nanogpt(strata::recipes::read_weights(hf.string()), module.module(),
                                                         options, hf.string());
      for (auto& item : module.module().named_parameters()) item.value().copy_(weights.at(item.key()));
    }
    module.module().eval();
    const auto want = strata::recipes::read_weights(hf.string() + "-logits.pt");
    torch::Tensor got;
    {
      torch::NoGradGuard no_grad;
      got = module.model()->forward(batch.input);
    }
    const double diff = (got - want.at("logits")).abs().max().item<double>();
    const double control = (want.at("other") - want.at("logits")).abs().max().item<double>();
    std::cout << "[ hf gpt2 ] " << activation << " (weights scaled up): max |strata - transformers| logits " << diff
              << ", the other GELU moves them " << control << std::endl;
    EXPECT_LE(diff, 1e-5);
    EXPECT_GT(control, 10 * diff);
    for (const std::string& from : {hf.string(), hf.string() + "-base"}) {
      const fs::path out = from + "-out";
      auto run = run_gpt_binary(flags(out) + " --max-steps 1 --batch-size 8 --activation " + activation +
                                " --init-from " + from);
      ASSERT_EQ(run.exit_code, 0) << run.output;
      EXPECT_NEAR(first_logged_loss(out / "metrics.csv"), std::stod(py["loss"]), 1e-5) << from;
    }
  }
  // A config.json of another model: shapes alone cannot tell 3 heads from 4,
  // nor one GELU from the other.
  const fs::path hf = dir.path() / "hf-gelu_new";
  auto refused = run_gpt_binary(flags(dir.path() / "out-act") + " --max-steps 1 --init-from " + hf.string());
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("activation_function gelu_new vs the model's gelu (give --activation gelu_new)"),
            std::string::npos)
      << refused.output;
  std::ifstream in(hf / "config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = config.find("\"n_head\": 3");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, 11, "\"n_head\": 4");
  std::ofstream(hf / "config.json") << config;
  refused = run_gpt_binary(flags(dir.path() / "out2") + " --max-steps 1 --activation gelu_new --init-from " +
                           hf.string());
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("n_head 4 vs the model's 3"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(dir.path() / "out2" / "metrics.csv"));
}

}  // namespace
