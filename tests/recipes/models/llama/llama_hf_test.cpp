// llama_hf_test - the Llama family against transformers, family by family
// (recipes/models/llama, recipes/models/llama/hf_checkpoint.h). transformers (PyPI, in
// the suite's venv) builds a small random model of each family, saves it with
// save_pretrained, and writes its logits and, after one backward of the
// next-token loss, every parameter's gradient. strata loads the directory
// (config.json and the safetensors, nothing else) and must agree: logits to
// 1e-5, gradients to 1e-5 of each tensor's largest. Controls show that the
// comparison can fail: without Qwen3's q/k norms, or with the RoPE pairs
// interleaved (the layout Meta's original checkpoints use) instead of
// rotate_half's halves, the logits are far off.
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "tests/temp_dir.h"
#include "strata/recipes/models/llama/hf_checkpoint.h"
#include "strata/recipes/io/safetensors.h"

#include <gtest/gtest.h>

#include <iostream>

namespace {
namespace fs = std::filesystem;
using strata::testing::run_command;

constexpr const char* kPython = STRATA_PYTHON;

constexpr const char* kScript = R"PY(
import sys
import torch
import transformers
from safetensors.torch import save_file

family, out = sys.argv[1], sys.argv[2]
common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)
if family == 'llama3':    # Llama 3.1's RoPE scaling; frequencies in all three of its regimes
    cfg = transformers.LlamaConfig(**common, rope_parameters=dict(
        rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))
elif family == 'qwen2.5':  # q/k/v biases, tied embeddings
    cfg = transformers.Qwen2Config(**common, tie_word_embeddings=True,
                                   rope_parameters=dict(rope_type='default', rope_theta=1e6))
elif family == 'qwen3':    # q/k norms, a head_dim of its own
    cfg = transformers.Qwen3Config(**common, head_dim=24, rope_parameters=dict(rope_type='default', rope_theta=1e6))
elif family == 'mistral':  # without grouping (4 kv heads for 4 heads): SDPA's causal path
    cfg = transformers.MistralConfig(**dict(common, num_key_value_heads=4), sliding_window=None,
                                     rope_parameters=dict(rope_type='default', rope_theta=1e6))
elif family == 'smollm2':  # SmolLM2-135M's shape in small: 3 heads over 1 kv head, tied
    cfg = transformers.LlamaConfig(**dict(common, num_attention_heads=3, num_key_value_heads=1, hidden_size=48),
                                   tie_word_embeddings=True, rope_parameters=dict(rope_type='default', rope_theta=1e5))
torch.manual_seed(0)
# eager: repeat_kv and an explicit softmax, the plainest reference
m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation='eager').float().train()
with torch.no_grad():   # every parameter random, biases and norm weights too, so each one matters
    for name, p in m.named_parameters():
        p.copy_(torch.randn_like(p) * 0.2 + (1.0 if 'norm' in name else 0.0))
m.save_pretrained(out)
ids = torch.randint(0, cfg.vocab_size, (2, 12))
target = torch.randint(0, cfg.vocab_size, (2, 12))
target[0, :3] = -1
logits = m(ids).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), ignore_index=-1)
loss.backward()
ref = {'input': ids, 'target': target, 'logits': logits.detach().contiguous()}
for name, p in m.named_parameters():
    ref['grad.' + name] = p.grad.contiguous()
save_file(ref, out + '-ref.safetensors')
print('loss=%.10f' % loss.item())
)PY";

bool have_transformers() {
  static const bool ok = run_command(std::string(kPython) + " -c 'import transformers'").exit_code == 0;
  return ok;
}

/// A family's directory and transformers' reference, made once per process.
struct Reference {
  fs::path dir;
  std::map<std::string, torch::Tensor> ref;
  double loss = 0;
};

const Reference& reference(const std::string& family) {
  static strata::testing::TempDir root;
  static std::map<std::string, Reference> made;
  auto it = made.find(family);
  if (it != made.end()) return it->second;
  Reference r;
  r.dir = root.path() / family;
  auto out = strata::testing::run_python(kPython, root.path() / "make.py", kScript, family + " " + r.dir.string());
  r.loss = std::stod(out.at("loss"));
  r.ref = strata::recipes::read_safetensors(r.dir.string() + "-ref.safetensors");
  return made.emplace(family, std::move(r)).first->second;
}

double max_abs(const torch::Tensor& t) { return t.abs().max().item<double>(); }

class LlamaHFTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!have_transformers()) GTEST_SKIP() << "'" << kPython << "' cannot import transformers: run scripts/setup";
  }
};

TEST_P(LlamaHFTest, LogitsAndGradientsEqualTransformers) {
  const auto& r = reference(GetParam());
  auto module = strata::recipes::load_hf_llama(r.dir.string());
  strata::Batch batch{r.ref.at("input").to(torch::kLong), r.ref.at("target").to(torch::kLong)};
  auto& model = module->model();
  const auto logits = model->forward(batch.input);
  const auto& want = r.ref.at("logits");
  const double diff = max_abs(logits - want);
  std::cout << "[ llama hf ] " << GetParam() << ": max |strata - transformers| logits " << diff << " (max |logit| "
            << max_abs(want) << ")\n";
  EXPECT_LT(diff, 1e-5);

  auto loss = module->training_step(batch);
  EXPECT_NEAR(loss.item<double>(), r.loss, 1e-5);
  loss.backward();
  int compared = 0;
  for (const auto& item : model->named_parameters()) {
    const auto& g = r.ref.at("grad." + item.key());
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double rel = max_abs(item.value().grad() - g) / max_abs(g);
    EXPECT_LT(rel, 1e-5) << item.key() << ": max |strata - transformers| / max |transformers| = " << rel;
    ++compared;
  }
  // Every parameter transformers has, strata has (and compared it).
  int expected = 0;
  for (const auto& [name, t] : r.ref) expected += name.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(compared, expected);
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaHFTest, ::testing::Values("llama3", "qwen2.5", "qwen3", "mistral", "smollm2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

class LlamaHFControlTest : public LlamaHFTest {};

TEST_F(LlamaHFControlTest, WithoutQwen3sQKNormTheLogitsDiffer) {
  const auto& r = reference("qwen3");
  auto options = strata::recipes::read_hf_llama_options(r.dir.string()).qk_norm(false);
  strata::recipes::LlamaModule module(options);
  auto tensors = strata::recipes::read_hf_tensors(r.dir.string());
  for (auto it = tensors.begin(); it != tensors.end();) {
    it = it->first.find("_norm.weight") != std::string::npos && it->first.find("self_attn") != std::string::npos
             ? tensors.erase(it)
             : std::next(it);
  }
  strata::recipes::load_llama_weights(module, tensors, r.dir.string());
  const double diff = max_abs(module.model()->forward(r.ref.at("input").to(torch::kLong)) - r.ref.at("logits"));
  EXPECT_GT(diff, 1e-2) << "the q/k norms changed nothing: the comparison cannot see them";
}

TEST_F(LlamaHFControlTest, InterleavedRopePairsGiveOtherLogits) {
  // The same weights with q_proj's and k_proj's output features permuted
  // from rotate_half's halves (0..D/2-1 | D/2..D-1) to interleaved pairs
  // (0, D/2, 1, D/2+1, ...): what loading Meta's layout unconverted does.
  const auto& r = reference("llama3");
  auto module = strata::recipes::load_hf_llama(r.dir.string());
  const auto options = module->model()->options();
  const int64_t d = options.head_size();
  auto perm = torch::stack({torch::arange(d / 2), torch::arange(d / 2) + d / 2}, 1).reshape({-1});
  {
    torch::NoGradGuard no_grad;
    for (auto& item : module->model()->named_parameters()) {
      const bool rotated = item.key().find("q_proj.weight") != std::string::npos ||
                           item.key().find("k_proj.weight") != std::string::npos;
      if (!rotated) continue;
      auto w = item.value().view({-1, d, item.value().size(1)});
      w.copy_(w.index_select(1, perm));
    }
  }
  const double diff = max_abs(module->model()->forward(r.ref.at("input").to(torch::kLong)) - r.ref.at("logits"));
  EXPECT_GT(diff, 1e-2) << "permuting RoPE's pairs changed nothing: the comparison cannot see the layout";
}

}  // namespace
