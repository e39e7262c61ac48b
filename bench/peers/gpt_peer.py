#!/usr/bin/env python3
r"""The PyTorch 2.x peer of `strata-gpt`: the same GPT job, written as an expert PyTorch user would.

Same model, data, initial weights and optimisation as strata-gpt (recipes/models/gpt.cpp, recipes/data/data.cpp,
trainer/trainer.cpp), so the losses of the two agree step by step; only the system differs.

  model      nanoGPT's layout: tied wte/lm_head, learned wpe, pre-LN blocks (ln_1, attn.c_attn, attn.c_proj,
             ln_2, mlp.c_fc, mlp.c_proj), exact GELU, LayerNorm eps 1e-5, dropout 0, attention by
             F.scaled_dot_product_attention(is_causal=True). Loss: mean cross-entropy on fp32 logits.
  weights    --init-from FILE: a dict name -> tensor under nanoGPT's names (strata-gpt --export-weights or
             strata-export write one; strata-gpt --init-from reads it). strata-gpt refuses --max-steps 0, so
             a comparison starts both from --write-init FILE: nanoGPT's init with strata's std (N(0, s),
             c_proj N(0, s/sqrt(2 n_layer)), zero biases; s = --init-std, 0: 0.02 scaled to the width) from --seed.
  data       --data FILE: byte-level text (vocab 256), the last 10% held out; train window j starts at
             hash2(seed ^ kTrainStream, j) % (len(train) - block_size); step s of rank r holds global windows
             [(s*world + r)*B, +B): a port of recipes/data/data.cpp.
  optimiser  torch.optim.AdamW(fused=True), betas (0.9, --adam-beta2: 0.95), eps 1e-8, decay on >= 2-D weights only; lr
             warmup then cosine decay to --min-lr at --max-steps (trainer/lr_schedule.cpp), set per step as
             nanoGPT does; clip_grad_norm_ by global norm (--gradient-clip-val, 0 = off).

Modes (--mode, named after the PyTorch API each runs; a strata strategy names its counterpart in its spec,
StrategySpec::pytorch_peer), ranks spawned by this script (torch.multiprocessing, gloo over a FileStore: no
sockets):
  local                    one process (torch.set_num_threads).
  DistributedDataParallel  DistributedDataParallel(gradient_as_bucket_view=True), as in PyTorch's DDP
                           tutorial; with --compile torch.compile(ddp_model), as the DDP docs show
                           (DDPOptimizer splits the graph at buckets).
  ZeroRedundancyOptimizer  DDP + ZeroRedundancyOptimizer(optimizer_class=AdamW, fused=True), as its docs show
                           (ZeRO-1; strata's oss).
  fully_shard              torch.distributed.fsdp.fully_shard (FSDP2) on each block, then on the root, FSDP2
                           defaults, as torchtitan does; with --compile each block is compiled before
                           fully_shard (torchtitan's order).
Precision: 32, or bf16-mixed: fp32 master weights, gradients and optimiser state with the forward under
torch.autocast("cpu", bfloat16) (local, DistributedDataParallel, ZeroRedundancyOptimizer; strata's
core/precision.h), or MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (fully_shard, as torchtitan).
--activation-checkpointing 1: each block under torch.utils.checkpoint(use_reentrant=False); with --ac-policy op
under torchtitan's op-level SAC policy (create_selective_checkpoint_contexts: keep SDPA's outputs and every
other matmul's, mm and addmm, since nanoGPT's Linears have biases).

Output: one JSON object, the last line of stdout (and --json FILE): per-step losses (the global mean, rank 0's
view) and gradient norms (before clipping), tokens/s as strata defines it, per-step times, per-rank peak RSS
(VmHWM), versions and flags.

  python bench/peers/gpt_peer.py --write-init init.pt --preset gpt-nano --block-size 64
  strata-gpt --strategy fsdp --nproc 2 --data input.txt --init-from init.pt --preset gpt-nano --block-size 64 \
      --batch-size 4 --max-steps 20 --limit-val-batches 0 --log-every-n-steps 1
  python bench/peers/gpt_peer.py --mode fully_shard --nproc 2 --data input.txt --init-from init.pt --preset gpt-nano \
      --block-size 64 --batch-size 4 --max-steps 20
"""
import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peer import LLAMA_PRESETS, HFLlama, write_llama_init  # noqa: E402  (strata's Llama presets)

PRESETS = {"gpt-nano": (3, 3, 48), "gpt-micro": (4, 4, 128), "gpt-mini": (6, 6, 192), "gpt2": (12, 12, 768)}
VOCAB = 256  # byte-level text
PROFILED_STEPS = (2, 4)  # 0-based: steps 3 to 5


# ---------------------------------------------------------------- model (nanoGPT's layout)
class CausalSelfAttention(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n_head = a.n_head
        self.c_attn = nn.Linear(a.n_embd, 3 * a.n_embd, bias=a.bias)
        self.c_proj = nn.Linear(a.n_embd, a.n_embd, bias=a.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.c_fc = nn.Linear(a.n_embd, 4 * a.n_embd, bias=a.bias)
        self.c_proj = nn.Linear(4 * a.n_embd, a.n_embd, bias=a.bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))  # exact GELU, as strata's torch::gelu


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        # strata's LayerNorms always carry a bias (recipes/models/gpt/interop.h), whatever --bias says.
        self.ln_1, self.attn = nn.LayerNorm(a.n_embd), CausalSelfAttention(a)
        self.ln_2, self.mlp = nn.LayerNorm(a.n_embd), MLP(a)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, a.n_embd), wpe=nn.Embedding(a.block_size, a.n_embd),
            h=nn.ModuleList(Block(a) for _ in range(a.n_layer)), ln_f=nn.LayerNorm(a.n_embd)))
        self.lm_head = nn.Linear(a.n_embd, VOCAB, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.activation_checkpointing = bool(a.activation_checkpointing)
        self.ac_policy = a.ac_policy
        # nanoGPT's init with strata's std (used by --write-init only): --init-std, or for 0 GPT-2's 0.02
        # scaled to the width as strata's gpt_init_std (recipes/models/gpt.h).
        std = a.init_std if a.init_std > 0 else 0.02 * math.sqrt(768 / a.n_embd) if a.n_embd < 768 else 0.02
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * a.n_layer) if name.endswith("c_proj.weight") else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)  # LayerNorm weights keep their 1

    def forward(self, idx, targets):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in t.h:
            if not self.activation_checkpointing:
                x = block(x)
            elif self.ac_policy == "op":
                x = checkpoint(block, x, use_reentrant=False, context_fn=op_sac_context)
            else:
                x = checkpoint(block, x, use_reentrant=False)
        logits = self.lm_head(t.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


# torchtitan's op-level SAC (torchtitan/models/llama3/infra/parallelize.py, _apply_ac_to_transformer_block):
# keep the attention kernels' outputs and every other matmul's; recompute the rest.
OP_SAC_SAVE = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
               torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
               torch.ops.aten._scaled_dot_product_flash_attention.default,
               torch.ops.aten._scaled_dot_product_efficient_attention.default}
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def op_sac_context():
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in MATMULS:
            counts[mode] += 1
        keep = func in OP_SAC_SAVE and not (func in MATMULS and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


# ---------------------------------------------------------------- data (a port of recipes/data/data.cpp)
MASK64 = (1 << 64) - 1
K_TRAIN_STREAM = 0x747261696E000001  # "train"


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class TextBytes:
    """TextBytesData's train windows: window j starts at hash2(seed ^ kTrainStream, j) % (len(train) - T)."""

    def __init__(self, path, block_size, seed):
        data = np.fromfile(path, dtype=np.uint8)
        val_len = max(len(data) // 10, block_size + 1)  # held out: the last 10%
        assert len(data) >= 2 * (block_size + 1), f"{path}: too short for block size {block_size}"
        self.train, self.T = data[: len(data) - val_len], block_size
        self.key = splitmix64((seed ^ K_TRAIN_STREAM) & MASK64)  # hash2(key, j) = splitmix64(splitmix64(key) ^ j)

    def batch(self, index, batch_size, rank, world):
        first = (index * world + rank) * batch_size
        span = len(self.train) - self.T
        rows = [self.train[o: o + self.T + 1]
                for o in (splitmix64(self.key ^ j) % span for j in range(first, first + batch_size))]
        w = torch.from_numpy(np.stack(rows).astype(np.int64))
        return w[:, :-1], w[:, 1:]


def lr_at(step, a):
    """trainer/lr_schedule.cpp: step 0 gets lr/(warmup+1); cosine from warmup to max_steps, then min_lr."""
    min_lr = min(a.min_lr, a.lr)
    if step < a.warmup_steps:
        return a.lr * (step + 1) / (a.warmup_steps + 1)
    if step >= a.max_steps or a.max_steps - a.warmup_steps <= 0:
        return min_lr
    progress = (step - a.warmup_steps) / (a.max_steps - a.warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (a.lr - min_lr)


def peak_rss_bytes():
    with open("/proc/self/status") as f:  # VmHWM, as strata's trainer/memory.cpp reads it
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


# ---------------------------------------------------------------- one rank
def build(a, world):
    """The model to call, the module whose parameters to clip, and the optimizer."""
    if a.llama:
        model = HFLlama(a.init_from, a)  # transformers' LlamaForCausalLM from the shared directory
    else:
        model = GPT(a)
        model.load_state_dict(torch.load(a.init_from, map_location="cpu", weights_only=True))
    model.to(a.device)
    a.parameters = sum(p.numel() for p in model.parameters())  # tied wte/lm_head once, as strata counts
    bf16 = a.precision == "bf16-mixed"
    if a.mode == "fully_shard":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh(a.device, (world,))
        mp_policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
                     else MixedPrecisionPolicy())
        for block in (model.blocks() if a.llama else model.transformer.h):
            if a.compile:
                block.compile(fullgraph=True)  # in place, before sharding (torchtitan)
            fully_shard(block, mesh=mesh, mp_policy=mp_policy)
        fully_shard(model, mesh=mesh, mp_policy=mp_policy)
        runner = model
    elif a.mode in ("DistributedDataParallel", "ZeroRedundancyOptimizer"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        runner = DDP(model, gradient_as_bucket_view=True)
        runner = torch.compile(runner) if a.compile else runner
    else:
        runner = torch.compile(model) if a.compile else model
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kw = dict(lr=a.lr, betas=(0.9, a.adam_beta2), eps=1e-8, fused=True)
    if a.mode == "ZeroRedundancyOptimizer":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)
    else:
        opt = torch.optim.AdamW(groups, **kw)
    return runner, model, opt


def run_rank(rank, world, a, store_path, result_path):
    torch.set_num_threads(a.threads_per_rank)
    distributed = a.mode != "local"
    if a.device == "cuda":
        torch.cuda.set_device(rank)  # one GPU per rank, as strata-gpt --device cuda
    if distributed:
        backend = "nccl" if a.device == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    data = TextBytes(a.data, a.block_size, a.seed)
    runner, model, opt = build(a, world)
    autocast = (torch.autocast(a.device, dtype=torch.bfloat16) if a.precision == "bf16-mixed" and a.mode != "fully_shard"
                else contextlib.nullcontext())
    losses, grad_norms, step_s = [], [], []
    profiler = None
    for step in range(a.max_steps):
        if a.profile and step == PROFILED_STEPS[0]:
            # Steps 3-5, as strata-gpt --profile traces them (callbacks/profiler.h).
            activities = [torch.profiler.ProfilerActivity.CPU]
            if a.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(activities=activities)
            profiler.__enter__()
        # Timed like strata's Trainer::run_step: batch, forward, backward, clip, step, zero_grad, and the
        # all-reduce of the loss for the log.
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a)
        x, y = (t.to(a.device, non_blocking=True) for t in data.batch(step, a.batch_size, rank, world))
        with autocast:
            loss = runner(x, y)
        loss.backward()
        if a.gradient_clip_val > 0:
            grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), a.gradient_clip_val).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean_loss = loss.detach().double().reshape(1)
        if distributed:
            dist.all_reduce(mean_loss)
            mean_loss /= world
        losses.append(mean_loss.item())
        step_s.append(time.perf_counter() - start)
        if profiler is not None and step == PROFILED_STEPS[1]:
            profiler.__exit__(None, None, None)
            os.makedirs(a.profile, exist_ok=True)
            profiler.export_chrome_trace(os.path.join(a.profile, f"trace-rank{rank}.json"))
            profiler = None
    rss = [peak_rss_bytes()]
    if distributed:
        rss = [None] * world
        dist.all_gather_object(rss, peak_rss_bytes())
    if rank == 0:
        write_result(a, world, losses, grad_norms, step_s, rss, result_path)
    if distributed:
        dist.destroy_process_group()
        # Exit without interpreter shutdown: gloo's worker threads outlive destroy_process_group (DDP keeps
        # the group alive in C++) and may free a finished collective's Python-owned tensors while the
        # interpreter is finalizing, which aborts the rank (SIGABRT; pytorch/pytorch#179291 describes it).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def write_result(a, world, losses, grad_norms, step_s, rss, path):
    # strata's FitResult::tokens_per_s: global tokens (batch * block * world per step) over rank 0's summed
    # step time, for the steady steps: all but the first (which pays one-off costs, here compilation too).
    steady = step_s[1:]
    tokens = a.batch_size * a.block_size * world * len(steady)
    result = {
        "peer": "pytorch", "torch": torch.__version__, "mode": a.mode, "nproc": world, "device": a.device,
        "threads_per_rank": a.threads_per_rank, "precision": a.precision, "compile": bool(a.compile),
        "activation_checkpointing": a.activation_checkpointing,
        "ac_policy": a.ac_policy,
        "model": {"n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd, "block_size": a.block_size,
                  "vocab_size": VOCAB},
        "batch_size": a.batch_size, "steps": a.max_steps, "parameters": a.parameters,
        "tokens_per_s": tokens / sum(steady) if steady else 0.0,
        "step_s": step_s, "first_step_s": step_s[0] if step_s else 0.0,
        "peak_rss_bytes": rss,
        "peak_cuda_bytes": torch.cuda.max_memory_allocated() if a.device == "cuda" else None,
        "losses": losses, "grad_norms": grad_norms,
        "final_train_loss": losses[-1] if losses else None,
    }
    with open(path, "w") as f:
        json.dump(result, f)


def write_strata_layout(result, out_dir):
    """summary.json and metrics.csv with the keys strata-bench reads from strata-gpt's (bench/aggregate.cpp):
    no tensor-memory or collective-byte counters (PyTorch has no such per-run figures on CPU); strata-bench
    measures the loopback bytes of both programs itself."""
    os.makedirs(out_dir, exist_ok=True)
    world, steps = result["nproc"], result["steps"]
    summary = {
        "system": "pytorch " + result["torch"] + (" compiled" if result["compile"] else " eager"),
        "strategy": result["mode"], "world_size": world, "precision": result["precision"], "steps": steps,
        "parameters": result["parameters"], "final_train_loss": result["final_train_loss"],
        "tokens_per_s": result["tokens_per_s"], "first_step_s": result["first_step_s"],
        "peak_rss_bytes": result["peak_rss_bytes"], "comm_bytes_rank0": {},
        "per_rank": [{"rank": r, "peak_rss_bytes": b} for r, b in enumerate(result["peak_rss_bytes"])],
    }
    summary["per_rank"][0]["tokens_per_s"] = result["tokens_per_s"]
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out_dir, "metrics.csv"), "w") as f:
        f.write("step,loss,step_time_s\n")
        for step, (loss, sec) in enumerate(zip(result["losses"], result["step_s"]), start=1):
            f.write(f"{step},{loss},{sec}\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["local", "DistributedDataParallel", "ZeroRedundancyOptimizer", "fully_shard"],
                   default="local")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--threads-per-rank", type=int, default=0, help="0: cores / nproc")
    p.add_argument("--precision", choices=["32", "bf16-mixed"], default="32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: one GPU per rank, NCCL between ranks, autocast on cuda (strata-gpt --device cuda)")
    p.add_argument("--activation-checkpointing", type=int, choices=[0, 1], default=0)
    p.add_argument("--ac-policy", choices=["full", "op"], default="full",
                   help="op: torchtitan's op-level selective checkpointing (strata-gpt --ac-policy op)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--preset", choices=sorted(PRESETS) + sorted(LLAMA_PRESETS), default="gpt-micro",
                   help="a Llama preset runs transformers' LlamaForCausalLM (llama_peer.py); --init-from and "
                        "--write-init are then transformers directories")
    for flag in ("--n-layer", "--n-head", "--n-embd"):
        p.add_argument(flag, type=int, help="overrides --preset")
    p.add_argument("--bias", type=int, choices=[0, 1], default=1)
    p.add_argument("--init-std", type=float, default=0.0, help="0: strata's width rule (0.02 at width >= 768)")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--max-steps", type=int, default=2500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--adam-beta2", type=float, default=0.95)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--gradient-clip-val", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", help="a text file (byte-level)")
    p.add_argument("--init-from", help="initial weights: a dict under nanoGPT's names (strata --export-weights)")
    p.add_argument("--write-init", metavar="FILE", help="write nanoGPT-initialised weights (from --seed) and exit")
    p.add_argument("--json", metavar="FILE", help="also write the result here")
    p.add_argument("--profile", metavar="DIR",
                   help="write DIR/trace-rank<r>.json, a Chrome trace of steps 3-5 (torch.profiler), as strata-gpt "
                        "--profile does; bench/trace_summary.py prints where a step's time goes")
    p.add_argument("--output-dir", metavar="DIR",
                   help="also write DIR/summary.json and DIR/metrics.csv in strata-gpt's layout (strata-bench)")
    a = p.parse_args(argv)
    a.llama = a.preset in LLAMA_PRESETS
    if a.llama and (a.n_layer or a.n_head or a.n_embd):
        p.error("a Llama preset takes no --n-layer/--n-head/--n-embd (its shape is the preset's)")
    for key, value in zip(("n_layer", "n_head", "n_embd"), (LLAMA_PRESETS if a.llama else PRESETS)[a.preset]):
        setattr(a, key, getattr(a, key) or value)
    a.threads_per_rank = a.threads_per_rank or max(1, (os.cpu_count() or 1) // a.nproc)
    if a.mode == "local" and a.nproc != 1:
        p.error("--mode local runs one process; use --nproc 1")
    if not a.write_init and not (a.data and a.init_from):
        p.error("--data and --init-from are required (or --write-init FILE)")
    return a


def main():
    a = parse_args()
    if a.write_init and a.llama:
        write_llama_init(a, VOCAB)
        return
    if a.write_init:
        torch.manual_seed(a.seed)
        torch.save(GPT(a).state_dict(), a.write_init)
        return
    with tempfile.TemporaryDirectory(prefix="gpt_peer.") as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.json")
        if a.mode == "local":
            run_rank(0, 1, a, store, result)
        else:
            mp.spawn(run_rank, args=(a.nproc, a, store, result), nprocs=a.nproc, join=True)
        with open(result) as f:
            text = f.read()
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    if a.output_dir:
        write_strata_layout(json.loads(text), a.output_dir)
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
