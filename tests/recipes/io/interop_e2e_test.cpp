// interop_test - strata-gpt against Python (the torch in scripts/setup's venv):
//  * nanoGPT weights: --export-weights files load into a nanoGPT-shaped model
//    written in Python and give strata's loss; weights written by Python
//    (a state_dict, or a nanoGPT ckpt.pt) start strata-gpt (--init-from) at
//    Python's loss; mismatched files are one error, exit 2.
//  * TorchScript: a model scripted in Python, trained 10 steps by strata-gpt
//    --torchscript under single, ddp x2 and fsdp x2, ends with the parameters
//    Python's own AdamW loop reaches on the same batches; the exported module
//    loads in Python and in C++ and gives the same loss.
// Batches come from the recipe's data source (addition:2), written by this
// test for Python (torch::pickle_save: Python's torch.load reads it).
#include "tests/process.h"
#include "tests/run_binary.h"
#include "tests/run_outputs.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/data/data.h"
#include "strata/recipes/models/gpt/gpt.h"
#include "strata/recipes/models/gpt/interop.h"
#include "strata/recipes/app/run.h"
#include "strata/recipes/models/torchscript/torchscript.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <sys/wait.h>

namespace {
namespace fs = std::filesystem;
using strata::Batch;
using strata::ShardInfo;
using strata::testing::run_gpt_binary;
using strata::testing::load_archive;
using strata::testing::first_logged_loss;
using strata::testing::run_command;
using strata::testing::save_dict;
using namespace strata::recipes;

constexpr const char* kPython = STRATA_PYTHON;  // scripts/setup's venv, with torch
constexpr const char* kData = "addition:2";
constexpr uint64_t kSeed = 1337;

fs::path scratch() {
  static const strata::testing::ScratchDir dir("strata-interop");
  return dir.path();
}

// One script, several commands (argv[1]); every result is printed as
// "key=value" lines for the C++ side.
constexpr const char* kScript = R"PY(
import math, sys
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- nanoGPT's model (model.py), dropout 0, naive attention ----
class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c['n_embd'], 3 * c['n_embd'], bias=c['bias'])
        self.c_proj = nn.Linear(c['n_embd'], c['n_embd'], bias=c['bias'])
        self.n_head = c['n_head']
        self.n_embd = c['n_embd']
    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        att = F.softmax(att.masked_fill(mask == 0, float('-inf')), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c['n_embd'], 4 * c['n_embd'], bias=c['bias'])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c['n_embd'], c['n_embd'], bias=c['bias'])
    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c['n_embd'])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c['n_embd'])
        self.mlp = MLP(c)
    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c['vocab_size'], c['n_embd']),
            wpe=nn.Embedding(c['block_size'], c['n_embd']),
            h=nn.ModuleList([Block(c) for _ in range(c['n_layer'])]),
            ln_f=nn.LayerNorm(c['n_embd'])))
        self.lm_head = nn.Linear(c['n_embd'], c['vocab_size'], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

def lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), ignore_index=-1)

def nano_config(a):
    return dict(n_layer=int(a[0]), n_head=int(a[1]), n_embd=int(a[2]), vocab_size=int(a[3]),
                block_size=int(a[4]), bias=True)

# ---- a small LM for TorchScript, with the unit protocol ----
class TinyBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c)
        self.mix = nn.Linear(c, c)          # a causal running mean, then a per-position MLP
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)
        self.drop = nn.Dropout(0.0)
    def forward(self, x):
        h = self.ln(x)
        t = torch.arange(1, x.size(1) + 1, dtype=x.dtype).view(1, -1, 1)
        h = h + self.mix(h.cumsum(1) / t)
        return x + self.drop(self.proj(F.gelu(self.fc(h))))

class TinyLM(nn.Module):
    def __init__(self, vocab, block, c, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.blocks = nn.ModuleList([TinyBlock(c) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one parameter under two names
    @torch.jit.export
    def embed(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
    @torch.jit.export
    def head(self, x):
        return self.lm_head(self.ln_f(x))
    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

cmd, a = sys.argv[1], sys.argv[2:]
torch.manual_seed(0)
if cmd == 'nanogpt_loss':      # weights batch n_layer n_head n_embd vocab block
    sd = torch.load(a[0])            # strata's file: torch.load's default (weights_only=True)
    print('type=' + type(sd).__name__)
    model = GPT(nano_config(a[2:]))
    model.load_state_dict(sd, strict=True)
    model.eval()
    b = torch.load(a[1], weights_only=False)   # the test's own batches (a typed C++ dict)
    with torch.no_grad():
        print('loss=%.10f' % lm_loss(model(b['input']), b['target']).item())
elif cmd == 'nanogpt_init':    # out_path ckpt|state_dict batch n_layer n_head n_embd vocab block
    model = GPT(nano_config(a[3:]))
    sd = model.state_dict()
    torch.save({'model': sd, 'iter_num': 5, 'config': {'lr': 0.1}} if a[1] == 'ckpt' else sd, a[0])
    b = torch.load(a[2], weights_only=False)
    with torch.no_grad():
        print('loss=%.10f' % lm_loss(model(b['input']), b['target']).item())
elif cmd == 'hostile':         # out_path marker protocol: a pickle whose REDUCE runs os.system
    import os, pickle
    class Payload:
        def __reduce__(self):
            return (os.system, ('touch ' + a[1],))
    if a[2] == 'torch':
        torch.save({'model': {'wte.weight': torch.zeros(2)}, 'config': Payload()}, a[0])
    else:
        with open(a[0], 'wb') as f:
            pickle.dump({'model': Payload()}, f, protocol=int(a[2]))
    print('written=1')
elif cmd == 'unsafe_load':     # path: what loading it with Python's pickle does (it runs the payload)
    import pickle
    try:
        torch.load(a[0], weights_only=False)
    except Exception:
        with open(a[0], 'rb') as f:
            pickle.load(f)
    print('loaded=1')
elif cmd == 'make_script':     # out_path vocab block width layers
    m = torch.jit.script(TinyLM(int(a[1]), int(a[2]), int(a[3]), int(a[4])))
    m.save(a[0])
    print('saved=1')
elif cmd == 'train_script':    # model batches steps lr weight_decay strata_export
    model = torch.jit.load(a[0])
    model.train()
    b = torch.load(a[1], weights_only=False)   # the test's own batches (a typed C++ dict)
    steps, lr, wd = int(a[2]), float(a[3]), float(a[4])
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([
        {'params': [p for p in params if p.dim() >= 2], 'weight_decay': wd},
        {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8)
    for s in range(steps):
        loss = lm_loss(model(b['x%d' % s]), b['y%d' % s])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    theirs = torch.jit.load(a[5])       # strata's --export-torchscript
    ours = dict(model.named_parameters())
    diff = 0.0
    names = 0
    for name, p in theirs.named_parameters():
        diff = max(diff, (p.detach() - ours[name].detach()).abs().max().item())
        names += 1
    print('params=%d' % names)
    print('expected_params=%d' % len(ours))
    print('maxdiff=%.3e' % diff)
    theirs.eval()
    with torch.no_grad():
        print('loss=%.10f' % lm_loss(theirs(b['val_x']), b['val_y']).item())
else:
    sys.exit('unknown command ' + cmd)
)PY";

/// Runs the script with `args`; the "key=value" lines it printed.
std::map<std::string, std::string> python(const std::string& args) {
  return strata::testing::run_python(kPython, scratch() / "interop.py", kScript, args);
}

bool have_python_torch() {
  static const bool ok = run_command(std::string(kPython) + " -c 'import torch'").exit_code == 0;
  return ok;
}


std::unique_ptr<strata::DataSource> data() { return make_data(kData, 0, 50257, kSeed); }

GPTOptions nano_options() {
  auto d = data();
  return gpt_preset("gpt-nano").vocab_size(d->vocab_size()).block_size(d->block_size());
}

std::string nano_args(const GPTOptions& o) {
  return std::to_string(o.n_layer()) + " " + std::to_string(o.n_head()) + " " + std::to_string(o.n_embd()) +
         " " + std::to_string(o.vocab_size()) + " " + std::to_string(o.block_size());
}

std::string gpt_flags(const fs::path& out) {
  return std::string("--preset gpt-nano --data ") + kData + " --seed " + std::to_string(kSeed) +
         " --log-every-n-steps 1 --limit-val-batches 1 --threads-per-rank 1 --progress-bar false"
         " --output-dir " + out.string();
}

/// The "loss" column of metrics.csv's first row (step 1: the loss before any update).

#define REQUIRE_PYTHON_TORCH()                                                             \
  if (!have_python_torch()) GTEST_SKIP() << "'" << kPython << "' cannot import torch (STRATA_PYTHON): run scripts/setup"

// strata-gpt trains under fsdp x2 and exports (a collective: the shards are
// gathered); the file is a plain dict that a nanoGPT model written in Python
// loads strictly, and that model's loss on a held-out batch is strata's loss
// with the same parameters (--dump-params, evaluated here in C++).
TEST(InteropTest, ExportedWeightsGiveStrataLossInPython) {
  REQUIRE_PYTHON_TORCH();
  const fs::path dir = scratch() / "export";
  fs::create_directories(dir);
  // Also a sharded checkpoint of the last step, which strata-export turns
  // into the same kind of file.
  const auto run = run_gpt_binary(gpt_flags(dir / "out") + " --strategy fsdp --nproc 2 --batch-size 4 --max-steps 4 " +
                                  "--export-weights " + (dir / "weights.pt").string() + " --dump-params " +
                                  (dir / "dump.pt").string() + " --checkpoint-every 4 --checkpoint-format sharded");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto exported_run = run_command(std::string(STRATA_EXPORT_BINARY) + " " + (dir / "out").string() + " " +
                                        (dir / "exported.pt").string());
  ASSERT_EQ(exported_run.exit_code, 0) << exported_run.output;
  {
    // The checkpoint's weights are the trained ones, tensor for tensor.
    const auto trained = strata::recipes::read_weights((dir / "weights.pt").string());
    const auto exported = strata::recipes::read_weights((dir / "exported.pt").string());
    ASSERT_EQ(trained.size(), exported.size());
    for (const auto& [name, value] : trained) {
      ASSERT_EQ(exported.count(name), 1u) << name;
      EXPECT_TRUE(torch::equal(value, exported.at(name))) << name;
    }
  }

  const GPTOptions options = nano_options();
  GPTModule module(options);
  {
    torch::NoGradGuard no_grad;
    const auto dumped = load_archive(dir / "dump.pt");
    for (auto& item : module.module().named_parameters()) item.value().copy_(dumped.at(item.key()));
  }
  module.module().eval();
  const Batch batch = data()->val_batch(0, 16, ShardInfo{});
  double strata_loss = 0.0;
  {
    torch::NoGradGuard no_grad;
    strata_loss = module.training_step(batch).item<double>();
  }
  save_dict(dir / "batch.pt", {{"input", batch.input}, {"target", batch.target}});

  for (const std::string file : {"weights.pt", "exported.pt"}) {
    SCOPED_TRACE(file);
    auto out = python("nanogpt_loss " + (dir / file).string() + " " + (dir / "batch.pt").string() + " " +
                      nano_args(options));
    EXPECT_EQ(out["type"], "dict");
    ASSERT_TRUE(out.count("loss")) << "python printed no loss";
    EXPECT_NEAR(std::stod(out["loss"]), strata_loss, 1e-5);
  }
}

// Python's nanoGPT model writes its weights (a torch.save'd state_dict under
// single, a nanoGPT ckpt.pt under fsdp x2, where init runs unit by unit);
// strata-gpt --init-from starts from them: its first logged loss (step 1,
// before any update) equals Python's loss on that global batch.
TEST(InteropTest, InitFromPythonWeightsStartsAtPythonLoss) {
  REQUIRE_PYTHON_TORCH();
  const GPTOptions options = nano_options();
  const Batch batch = data()->train_batch(0, 8, ShardInfo{});
  const fs::path dir = scratch() / "init";
  fs::create_directories(dir);
  save_dict(dir / "batch.pt", {{"input", batch.input}, {"target", batch.target}});
  for (const std::string format : {"state_dict", "ckpt"}) {
    SCOPED_TRACE(format);
    const fs::path weights = dir / (format + ".pt");
    auto py = python("nanogpt_init " + weights.string() + " " + format + " " + (dir / "batch.pt").string() + " " +
                     nano_args(options));
    ASSERT_TRUE(py.count("loss"));
    const std::string launch =
        format == "ckpt" ? " --strategy fsdp --nproc 2 --batch-size 4" : " --strategy single --batch-size 8";
    const fs::path out = dir / ("out-" + format);
    const auto run = run_gpt_binary(gpt_flags(out) + launch + " --max-steps 1 --init-from " + weights.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NEAR(first_logged_loss(out / "metrics.csv"), std::stod(py["loss"]), 1e-5);
  }
}

// A file that does not fit the model: every problem in one error line,
// exit 2, before training (no output directory made).
TEST(InteropTest, InitFromMismatchIsOneErrorListingEveryProblem) {
  const GPTOptions options = nano_options();
  GPTModule module(options);
  auto weights = to_nanogpt(named_parameters_of(module.module()), options);
  weights.erase("transformer.h.1.mlp.c_fc.bias");
  weights.erase("transformer.ln_f.weight");
  weights["transformer.wpe.weight"] = torch::zeros({3, options.n_embd()});
  weights["transformer.h.9.attn.c_attn.weight"] = torch::zeros({2});
  const fs::path dir = scratch() / "mismatch";
  fs::create_directories(dir);
  save_dict(dir / "bad.pt", weights);
  const auto run = run_gpt_binary(gpt_flags(dir / "out") + " --max-steps 1 --init-from " + (dir / "bad.pt").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("missing: transformer.h.1.mlp.c_fc.bias, transformer.ln_f.weight"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("unexpected: transformer.h.9.attn.c_attn.weight"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("shape of transformer.wpe.weight: file [3, 48] vs model [" +
                            std::to_string(options.block_size()) + ", 48]"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  EXPECT_FALSE(fs::exists(dir / "out"));

  const auto missing = run_gpt_binary(gpt_flags(dir / "out") + " --init-from " + (dir / "nope.pt").string());
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("nope.pt"), std::string::npos) << missing.output;
}

TEST(InteropTest, APickleThatWouldRunCodeIsRefusedAndNothingRuns) {
  // A torch.save file, and bare pickles of protocol 2 and 4, whose REDUCE
  // calls os.system to create a marker. Python's own unpickler runs it (the
  // marker appears); strata refuses each file before unpickling, in one
  // line naming the global (or the opcode that hides it), and no marker is
  // made. Seen failing with check_pickle_globals() removed: LibTorch's C++
  // unpickler runs no Python, so nothing ran then either, but it refused
  // later and in its own words ("Unpickler found unknown type posix.system";
  // the bare pickles as "failed finding central directory").
  const fs::path dir = scratch() / "hostile";
  fs::create_directories(dir);
  const fs::path marker = dir / "marker";
  for (const std::pair<std::string, std::string>& kind :
       {std::pair<std::string, std::string>{"torch", "names the global 'posix.system'"},
        {"2", "names the global 'posix.system'"},
        {"4", "calls a global it does not name (opcode 0x93"}}) {
    const fs::path file = dir / ("payload-" + kind.first + ".pt");
    python("hostile " + file.string() + " " + marker.string() + " " + kind.first);
    python("unsafe_load " + file.string());
    EXPECT_TRUE(fs::exists(marker)) << kind.first << ": the payload is real (Python's unpickler runs it)";
    fs::remove(marker);
    const auto run = run_gpt_binary(gpt_flags(dir / "out") + " --max-steps 1 --init-from " + file.string());
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(kind.second), std::string::npos) << kind.first << "\n" << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
    EXPECT_FALSE(fs::exists(marker)) << kind.first << ": strata ran the payload";
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
}

// ---- TorchScript ----------------------------------------------------------

constexpr int64_t kScriptSteps = 10;
constexpr int64_t kGlobalBatch = 8;
constexpr double kScriptLr = 1e-2;
constexpr double kWeightDecay = 0.1;

/// The scripted model and the batches, made once per test binary.
const fs::path& scripted_model() {
  static const fs::path path = [] {
    const fs::path dir = scratch() / "script";
    fs::create_directories(dir);
    auto d = data();
    python("make_script " + (dir / "model.pt").string() + " " + std::to_string(d->vocab_size()) + " " +
           std::to_string(d->block_size()) + " 16 2");
    std::map<std::string, torch::Tensor> batches;
    for (int64_t s = 0; s < kScriptSteps; ++s) {
      // Step s's global batch: the union of the ranks' micro-batches (DataSource contract).
      const Batch b = d->train_batch(s, kGlobalBatch, ShardInfo{});
      batches[c10::str("x", s)] = b.input;
      batches[c10::str("y", s)] = b.target;
    }
    const Batch val = d->val_batch(0, 16, ShardInfo{});
    batches["val_x"] = val.input;
    batches["val_y"] = val.target;
    save_dict(dir / "batches.pt", batches);
    return dir / "model.pt";
  }();
  return path;
}

struct ScriptRun {
  std::string name;
  std::string strategy;
  int nproc;
  std::string extra;  ///< more flags
};

void PrintTo(const ScriptRun& run, std::ostream* os) { *os << run.name; }

class TorchScriptParity : public ::testing::TestWithParam<ScriptRun> {};

// strata-gpt --torchscript under `strategy` x `nproc` (constant lr, no
// clipping) ends with the parameters Python's AdamW loop reaches on the same
// batches (within 1e-5); the exported module (--export-torchscript) loads in
// Python and in C++ and gives the same loss on a held-out batch.
TEST_P(TorchScriptParity, MatchesPythonAdamWAfterTenSteps) {
  REQUIRE_PYTHON_TORCH();
  const auto& [name, strategy, nproc, extra] = GetParam();
  const fs::path model = scripted_model();
  ASSERT_TRUE(fs::exists(model));
  const fs::path dir = scratch() / ("script-" + name);
  fs::create_directories(dir);
  const fs::path exported = dir / "trained.pt";
  const std::string flags =
      std::string("--torchscript ") + model.string() + " --data " + kData + " --seed " + std::to_string(kSeed) +
      " --strategy " + strategy + (nproc > 1 ? " --nproc " + std::to_string(nproc) : "") + " --batch-size " +
      std::to_string(kGlobalBatch / nproc) + " --max-steps " + std::to_string(kScriptSteps) + " --lr " +
      std::to_string(kScriptLr) + " --min-lr " + std::to_string(kScriptLr) +
      " --warmup-steps 0 --weight-decay 0.1 --adam-beta2 0.95 --gradient-clip-val 0 --log-every-n-steps 1"
      " --limit-val-batches 1"
      " --threads-per-rank 1 --progress-bar false --output-dir " + (dir / "out").string() +
      " --export-torchscript " + exported.string() + extra;
  const auto run = run_gpt_binary(flags);
  ASSERT_EQ(run.exit_code, 0) << run.output;

  auto py = python("train_script " + model.string() + " " + (model.parent_path() / "batches.pt").string() + " " +
                   std::to_string(kScriptSteps) + " " + std::to_string(kScriptLr) + " " +
                   std::to_string(kWeightDecay) + " " + exported.string());
  ASSERT_TRUE(py.count("maxdiff") && py.count("loss"));
  EXPECT_EQ(py["params"], py["expected_params"]);
  EXPECT_GT(std::stoi(py["params"]), 0);
  EXPECT_LT(std::stod(py["maxdiff"]), 1e-5) << "strata vs Python parameters after " << kScriptSteps << " steps";
  std::cout << "  " << name << ": max |strata - python| over parameters " << py["maxdiff"] << std::endl;
  if (strategy == "single") {
    // Control: Python with a 1% larger lr must be told apart.
    auto control = python("train_script " + model.string() + " " + (model.parent_path() / "batches.pt").string() +
                          " " + std::to_string(kScriptSteps) + " " + std::to_string(kScriptLr * 1.01) + " " +
                          std::to_string(kWeightDecay) + " " + exported.string());
    EXPECT_GT(std::stod(control["maxdiff"]), 1e-5) << "the comparison cannot tell a 1% lr change";
  }

  // C++: the exported module, loaded as strata loads a model, gives Python's loss.
  TorchScriptModule trained(exported.string());
  EXPECT_TRUE(trained.has_units());
  trained.module().eval();
  auto d = data();
  const Batch val = d->val_batch(0, 16, ShardInfo{});
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(trained.training_step(val).item<double>(), std::stod(py["loss"]), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Strategies, TorchScriptParity,
                         ::testing::Values(ScriptRun{"single", "single", 1, ""}, ScriptRun{"ddp", "ddp", 2, ""},
                                           ScriptRun{"fsdp", "fsdp", 2, ""},
                                           // checkpointing recomputes each scripted block in backward,
                                           // inside FSDP's units: FSDP(checkpoint(block))
                                           ScriptRun{"fsdp_checkpointed", "fsdp", 2, " --activation-checkpointing 1"}),
                         [](const auto& info) { return info.param.name; });

// The adapter presents the scripted module's own tensors, and train()/eval()
// reach the scripted module (its dropout).
TEST(InteropTest, TorchScriptAdapterSharesTensorsAndTrainingMode) {
  REQUIRE_PYTHON_TORCH();
  TorchScriptModule module(scripted_model().string());
  const auto scripted = module.scripted().named_parameters(/*recurse=*/true);
  auto adapted = module.module().named_parameters(/*recurse=*/true);
  std::set<const void*> scripted_impls, adapted_impls;
  for (const auto& p : scripted) scripted_impls.insert(p.value.unsafeGetTensorImpl());
  for (const auto& p : adapted) adapted_impls.insert(p.value().unsafeGetTensorImpl());
  EXPECT_EQ(adapted_impls, scripted_impls);  // the same tensors, not copies
  EXPECT_EQ(adapted.size(), adapted_impls.size());  // each once: the tied head is not listed twice
  EXPECT_FALSE(adapted.contains("lm_head.weight"));
  EXPECT_TRUE(adapted.contains("wte.weight"));
  ASSERT_EQ(module.wrap_units().size(), 2u);
  torch::jit::Module block0 = module.scripted().attr("blocks").toModule().attr("0").toModule();
  EXPECT_EQ(module.wrap_units()[0]->named_parameters().size(),
            block0.named_parameters().size());
  module.module().eval();
  EXPECT_FALSE(module.scripted().is_training());
  EXPECT_FALSE(block0.is_training());
  module.module().train();
  EXPECT_TRUE(block0.is_training());
  // set_data on the adapter's parameter is what the scripted code computes with.
  auto& weight = adapted["wte.weight"];  // also the tied head
  weight.set_data(torch::zeros_like(weight));
  const Batch batch = data()->val_batch(0, 2, ShardInfo{});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(module.forward(batch.input).eq(0).all().item<bool>());
}

// Bad --torchscript input: one-line errors, exit 2.
TEST(InteropTest, TorchScriptBadInputIsExitTwo) {
  const fs::path dir = scratch() / "script-bad";
  fs::create_directories(dir);
  std::ofstream(dir / "junk.pt") << "not a model";
  const auto junk = run_gpt_binary("--torchscript " + (dir / "junk.pt").string() + " --output-dir " +
                                   (dir / "out").string());
  EXPECT_EQ(junk.exit_code, 2) << junk.output;
  EXPECT_NE(junk.output.find("cannot load TorchScript model"), std::string::npos) << junk.output;
  const auto preset = run_gpt_binary("--torchscript x.pt --preset gpt-mini");
  EXPECT_EQ(preset.exit_code, 2) << preset.output;
  EXPECT_NE(preset.output.find("--preset does not apply with --torchscript"), std::string::npos) << preset.output;
  const auto export_only = run_gpt_binary("--export-torchscript y.pt");
  EXPECT_EQ(export_only.exit_code, 2) << export_only.output;
  EXPECT_NE(export_only.output.find("--export-torchscript needs --torchscript"), std::string::npos)
      << export_only.output;
}

}  // namespace
