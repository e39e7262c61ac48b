// llama_lora_test - the Llama family's LoRA against PEFT, the library users
// trust for adapters (PyPI, in the suite's venv). transformers builds a small
// random Llama and saves it; PEFT wraps it with adapters of rank 4 on all
// seven projections (lora_dropout 0, A and B random so that every adapter
// matters), saves them as PEFT does, and writes the logits, the adapters'
// gradients after one backward of the next-token loss, and the logits of
// merge_and_unload(). strata loads the base directory and PEFT's adapter
// file, and must agree: logits to 1e-5, each adapter gradient to 1e-5 of its
// largest, and its merge (merge_lora, what strata-export writes) to PEFT's
// merged logits. A control shows the comparison sees the scale alpha / r.
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"
#include "strata/recipes/io/safetensors.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/models/lora.h"

#include <gtest/gtest.h>

#include <iostream>

namespace {
namespace fs = std::filesystem;
using namespace strata::recipes;

constexpr const char* kPython = STRATA_PYTHON;

constexpr const char* kScript = R"PY(
import sys
import torch
import transformers
import peft
from safetensors.torch import save_file

out = sys.argv[1]
cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               rope_parameters=dict(rope_type='default', rope_theta=10000.0))
torch.manual_seed(0)
m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation='eager').float()
with torch.no_grad():
    for name, p in m.named_parameters():
        p.copy_(torch.randn_like(p) * 0.2 + (1.0 if 'norm' in name else 0.0))
m.save_pretrained(out + '/base')
lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type='CAUSAL_LM',
                       target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'])
pm = peft.get_peft_model(m, lora)
with torch.no_grad():
    for name, p in pm.named_parameters():
        if 'lora_' in name:
            p.copy_(torch.randn_like(p) * 0.1)
pm.train()
pm.save_pretrained(out + '/adapter')
ids = torch.randint(0, cfg.vocab_size, (2, 12))
target = torch.randint(0, cfg.vocab_size, (2, 12))
logits = pm(input_ids=ids).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
loss.backward()
trainable = sum(p.numel() for p in pm.parameters() if p.requires_grad)  # before the merge removes them
ref = {'input': ids, 'target': target, 'logits': logits.detach().contiguous()}
for name, p in pm.named_parameters():
    if p.requires_grad:
        ref['grad.' + name] = p.grad.contiguous()
with torch.no_grad():
    ref['merged_logits'] = pm.merge_and_unload()(input_ids=ids).logits.contiguous()
save_file(ref, out + '/ref.safetensors')
print('loss=%.10f' % loss.item())
print('trainable=%d' % trainable)
)PY";

/// PEFT's "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
/// (or .lora_A.default.weight, its parameter name) -> strata's
/// "model.layers.0.self_attn.q_proj_lora.A"; "" for anything else.
std::string strata_name(std::string peft) {
  const std::string prefix = "base_model.model.";
  if (peft.rfind(prefix, 0) != 0) return "";
  peft = peft.substr(prefix.size());
  for (const char* ab : {"A", "B"}) {
    for (const std::string tail : {".default.weight", ".weight"}) {
      const std::string suffix = std::string(".lora_") + ab + tail;
      if (peft.ends_with(suffix)) return peft.substr(0, peft.size() - suffix.size()) + "_lora." + ab;
    }
  }
  return "";
}

struct Peft {
  strata::testing::TempDir dir;
  std::map<std::string, torch::Tensor> ref;
  double loss = 0;
  int64_t trainable = 0;
};

const Peft* peft_reference() {
  static std::unique_ptr<Peft> made;
  static bool tried = false;
  if (tried) return made.get();
  tried = true;
  if (strata::testing::run_command(std::string(kPython) + " -c 'import peft, transformers'").exit_code != 0) {
    return nullptr;
  }
  made = std::make_unique<Peft>();
  auto out = strata::testing::run_python(kPython, made->dir.path() / "make.py", kScript, made->dir.path().string());
  made->loss = std::stod(out.at("loss"));
  made->trainable = std::stoll(out.at("trainable"));
  made->ref = read_safetensors((made->dir.path() / "ref.safetensors").string());
  return made.get();
}

/// The base directory's model with PEFT's adapters (rank 4, `alpha`).
std::unique_ptr<LlamaModule> with_peft_adapters(const Peft& p, double alpha) {
  const auto base = (p.dir.path() / "base").string();
  auto options = read_hf_llama_options(base).lora_rank(4).lora_alpha(alpha).lora_targets("all");
  auto module = std::make_unique<LlamaModule>(options);
  auto tensors = read_hf_tensors(base);
  for (const auto& [name, t] : read_safetensors((p.dir.path() / "adapter" / "adapter_model.safetensors").string())) {
    const auto ours = strata_name(name);
    EXPECT_FALSE(ours.empty()) << "unexpected tensor in PEFT's adapter file: " << name;
    tensors[ours] = t;
  }
  torch::NoGradGuard no_grad;
  int copied = 0;
  for (auto& item : module->module().named_parameters()) {
    const auto it = tensors.find(item.key());
    EXPECT_NE(it, tensors.end()) << item.key();
    if (it == tensors.end()) continue;
    item.value().copy_(it->second);
    ++copied;
  }
  EXPECT_EQ(copied, static_cast<int>(tensors.size() - (tensors.count("lm_head.weight") && options.tie_weights())));
  return module;
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

class LlamaLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    peft_ = peft_reference();
    if (peft_ == nullptr) GTEST_SKIP() << "'" << kPython << "' cannot import peft and transformers: run scripts/setup";
  }
  const Peft* peft_ = nullptr;
};

TEST_F(LlamaLoraTest, LogitsAdapterGradientsAndTheMergeEqualPeft) {
  auto module = with_peft_adapters(*peft_, 8.0);
  strata::Batch batch{peft_->ref.at("input").to(torch::kLong), peft_->ref.at("target").to(torch::kLong)};
  const auto logits = module->model()->forward(batch.input);
  const double diff = max_abs(logits - peft_->ref.at("logits"));
  std::cout << "[ llama lora ] max |strata - peft| logits " << diff << "\n";
  EXPECT_LT(diff, 1e-5);

  auto loss = module->training_step(batch);
  EXPECT_NEAR(loss.item<double>(), peft_->loss, 1e-5);
  loss.backward();
  int64_t trainable = 0;
  int compared = 0;
  for (const auto& [name, g] : peft_->ref) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto ours = strata_name(name.substr(5));
    auto& param = module->module().named_parameters()[ours];
    ASSERT_TRUE(param.grad().defined()) << ours;
    const double rel = max_abs(param.grad() - g) / max_abs(g);
    EXPECT_LT(rel, 1e-5) << ours << ": max |strata - peft| / max |peft| = " << rel;
    ++compared;
  }
  for (const auto& p : module->module().parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  EXPECT_EQ(compared, 2 * 7 * 2);  // A and B of seven projections in two blocks
  EXPECT_EQ(trainable, peft_->trainable);
  EXPECT_EQ(count_llama_lora_parameters(module->model()->options()), peft_->trainable);

  // The merge strata-export writes is a plain Llama with PEFT's merged logits.
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : module->module().named_parameters()) params[item.key()] = item.value().detach();
  const auto merged = merge_lora(params, 4, 8.0);
  LlamaModule plain(LlamaOptions(module->model()->options()).lora_rank(0));
  EXPECT_EQ(merged.size(), plain.module().named_parameters().size());
  load_llama_weights(plain, merged, "merged");
  const double merged_diff = max_abs(plain.model()->forward(batch.input) - peft_->ref.at("merged_logits"));
  std::cout << "[ llama lora ] max |strata merged - peft merged| logits " << merged_diff << "\n";
  EXPECT_LT(merged_diff, 1e-5);
}

TEST_F(LlamaLoraTest, AnotherAlphaGivesOtherLogits) {
  // The control: the same adapters at alpha 16 (scale 4 instead of 2).
  auto module = with_peft_adapters(*peft_, 16.0);
  const double diff = max_abs(module->model()->forward(peft_->ref.at("input").to(torch::kLong)) - peft_->ref.at("logits"));
  EXPECT_GT(diff, 1e-2) << "doubling the adapters' scale changed nothing: the comparison cannot see it";
}

TEST(LlamaLoraTargetsTest, PeftNamesAndShortNamesOrAnErrorNamingTheValue) {
  const auto qv = parse_llama_lora_targets(" q_proj , v");
  EXPECT_TRUE(qv.q && qv.v && !qv.k && !qv.o && !qv.mlp());
  const auto all = parse_llama_lora_targets("all");
  EXPECT_EQ(all.column_count() + all.row_count(), 7);
  for (const std::string bad : {"q,x", "q,q", "", "q,", "attn"}) {
    try {
      parse_llama_lora_targets(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const c10::ValueError& e) {
      const std::string what = e.what_without_backtrace();
      EXPECT_NE(what.find("'" + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("allowed: q, k, v, o, gate, up, down"), std::string::npos) << what;
    }
  }
}

TEST(LlamaLoraTargetsTest, CountsMatchTheBuiltModelAndOneTensorParallelRank) {
  // Every target set's adapters, counted and built; under tp 2 a rank's
  // share as the plan splits them (column adapters' B, row adapters' A).
  for (const std::string targets : {"q,v", "o,down", "all"}) {
    const auto o = LlamaOptions(2, 4, 48, 128).n_kv_head(2).vocab_size(16).block_size(8).lora_rank(4)
                       .lora_targets(targets);
    LlamaModule m(o);
    int64_t adapters = 0, trainable = 0, split = 0;
    const auto plan = m.tensor_parallel_plan();
    for (const auto& item : m.module().named_parameters()) {
      if (!is_lora_parameter(item.key())) continue;
      adapters += item.value().numel();
      trainable += item.value().requires_grad() ? item.value().numel() : 0;
      split += strata::tp::layout_of(plan, item.key(), item.value().dim()) ? item.value().numel() / 2
                                                                             : item.value().numel();
    }
    EXPECT_EQ(count_llama_lora_parameters(o), adapters) << targets;
    EXPECT_EQ(trainable, adapters) << targets;
    EXPECT_EQ(count_llama_lora_parameters(o, 2), split) << targets;
    EXPECT_EQ(count_parameters(o), count_parameters(LlamaOptions(o).lora_rank(0)) + adapters) << targets;
  }
}

}  // namespace
