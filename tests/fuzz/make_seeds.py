#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs (tests/fuzz/corpus/<target>/seed-*).

Each seed is a file as users have it: written by the library that makes it
(safetensors, torch.save, transformers, PEFT, tiktoken, strata-gpt's own
checkpoints and config.ini), or one of the upstream fixtures under
tests/fixtures/ (configs verbatim; tokenizers cut to their first few hundred
tokens, so that a fuzzer mutates a small file of the real structure).
tests/fuzz/corpus/SOURCES.md says which seed came from where.

    <venv>/bin/python tests/fuzz/make_seeds.py STRATA_GPT_BINARY
"""
import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests/fuzz/corpus"
FIXTURES = ROOT / "tests/fixtures"


def out(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + name)).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds():
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "f32.safetensors": ({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}, None),
            "mixed.safetensors": ({"h": torch.ones(2, 2, dtype=torch.float16), "g": torch.ones(4, dtype=torch.bfloat16),
                                   "d": torch.zeros(1, dtype=torch.float64), "s": torch.tensor(3.0)}, {"format": "pt"}),
            "empty_tensor.safetensors": ({"e": torch.zeros(0, 4)}, {"format": "pt"}),
        }
        for name, (tensors, metadata) in cases.items():
            save_file(tensors, f"{tmp}/{name}", metadata=metadata)
            out("safetensors", name, pathlib.Path(f"{tmp}/{name}").read_bytes())


def pickle_seeds():
    with tempfile.TemporaryDirectory() as tmp:
        sd = collections.OrderedDict([("transformer.wte.weight", torch.ones(4, 2)), ("lm_head.weight", torch.ones(4, 2))])
        torch.save(sd, f"{tmp}/a")
        out("pickle", "state_dict.pt", pathlib.Path(f"{tmp}/a").read_bytes())
        # nanoGPT's train.py: model, optimizer, model_args, iter_num, best_val_loss, config
        ckpt = {"model": sd, "optimizer": {"state": {}, "param_groups": [{"lr": 6e-4, "params": [0, 1]}]},
                "model_args": {"n_layer": 1, "n_head": 1, "n_embd": 2, "block_size": 4, "bias": False,
                               "vocab_size": 4, "dropout": 0.0},
                "iter_num": 5, "best_val_loss": torch.tensor(2.5), "config": {"dataset": "shakespeare_char"}}
        torch.save(ckpt, f"{tmp}/b")
        out("pickle", "nanogpt_ckpt.pt", pathlib.Path(f"{tmp}/b").read_bytes())
        torch.save(sd, f"{tmp}/c", _use_new_zipfile_serialization=False)
        # torch.save's format before 1.6: strata reads the zip archive only
        out("pickle", "refused-legacy_format.pt", pathlib.Path(f"{tmp}/c").read_bytes())


def strata_seeds(strata_gpt):
    with tempfile.TemporaryDirectory() as tmp:
        tiny = ["--preset", "gpt-nano", "--n-layer", "1", "--n-embd", "4", "--n-head", "1", "--max-steps", "1",
                "--checkpoint-every", "1"]
        runs = {"full": [], "sharded": ["--nproc", "2", "--strategy", "fsdp", "--checkpoint-format", "sharded"]}
        for name, extra in runs.items():
            subprocess.run([strata_gpt, *tiny, *extra, "--output-dir", f"{tmp}/{name}"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            step = pathlib.Path(f"{tmp}/{name}/checkpoints/step-1")
            data = b"".join(p.read_bytes() for p in sorted(step.iterdir()) if p.suffix == ".bin")
            out("checkpoint", name, (step / "metadata.json").read_bytes() + b"\0" + data)
            out("config_ini", f"{name}.ini", pathlib.Path(f"{tmp}/{name}/config.ini").read_bytes())


# Upstream configs strata refuses by design: a DeepSpeed file named by a path
# relative to where the YAML was (not in the fuzz workspace), and mpirun.
REFUSED_CONFIGS = {"accelerate_deepspeed.yaml", "accelerate_multi_node_cpu_docs.yaml"}


def config_seeds():
    for p in sorted((FIXTURES / "configs").iterdir()):
        name = ("refused-" if p.name in REFUSED_CONFIGS else "") + p.name
        if p.suffix == ".json":
            out("deepspeed_json", name, p.read_bytes())
        elif p.suffix == ".yaml":
            out("accelerate_yaml", name, p.read_bytes())


def nanogpt_seeds():
    from tokenizers import Tokenizer  # the GPT-2 BPE nanoGPT's prepare.py encodes with (via tiktoken)
    enc = Tokenizer.from_file(str(FIXTURES / "tokenizers/gpt2/tokenizer.json"))
    ids = enc.encode("First Citizen:\nBefore we proceed any further, hear me speak.\n").ids
    out("nanogpt_bin", "gpt2_tokens.bin", np.array(ids, dtype=np.uint16).tobytes())
    # shakespeare_char's prepare.py: character ids below its 65-letter vocabulary
    out("nanogpt_bin", "char_tokens.bin", np.array([18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52], dtype=np.uint16).tobytes())


def hf_seeds():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    for cls in (LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config):
        with tempfile.TemporaryDirectory() as tmp:
            cls(**small).save_pretrained(tmp)
            out("hf_config", cls.model_type + ".json", pathlib.Path(f"{tmp}/config.json").read_bytes())
    index = {"metadata": {"total_size": 64},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}}
    out("hf_index", "index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")


def cut_tokenizer(doc, keep):
    """tokenizer.json with its model's vocabulary cut to ids below `keep`."""
    model = doc["model"]
    vocab = model["vocab"]
    if isinstance(vocab, dict):
        model["vocab"] = {t: i for t, i in vocab.items() if i < keep}
        kept = set(model["vocab"])
        if "merges" in model:
            def parts(m):
                return m.split(" ", 1) if isinstance(m, str) else m
            model["merges"] = [m for m in model["merges"]
                               if all(p in kept for p in parts(m)) and "".join(parts(m)) in kept][:keep]
    else:  # Unigram: a list of [piece, score]
        model["vocab"] = vocab[:keep]
    doc["added_tokens"] = [t for t in doc.get("added_tokens", [])][:4]
    for i, t in enumerate(doc["added_tokens"]):
        t["id"] = keep + i
    return doc


def tokenizer_seeds():
    for name in ("gpt2", "llama3", "mistral", "phi3", "qwen3", "tinyllama"):
        doc = json.loads((FIXTURES / "tokenizers" / name / "tokenizer.json").read_text(encoding="utf-8"))
        doc = cut_tokenizer(doc, 300)
        for special in ("post_processor",):
            if doc.get(special) and "special_tokens" in json.dumps(doc[special]):
                doc[special] = None  # its ids point past the cut vocabulary
        out("tokenizer_json", name + ".json", json.dumps(doc, ensure_ascii=False, indent=1))
    lines = (FIXTURES / "tokenizers/llama3-tiktoken/tokenizer.model").read_bytes().splitlines(keepends=True)
    out("tiktoken", "llama3_head.model", b"".join(lines[:400]))


def instruct_seeds():
    alpaca = (FIXTURES / "instruct/alpaca20.json").read_bytes()
    out("instruct", "alpaca20.json", alpaca)
    records = json.loads(alpaca)[:3]
    out("instruct", "alpaca3.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    chat = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": "4"}]}]
    out("instruct", "messages.jsonl", "".join(json.dumps(r) + "\n" for r in chat))


def peft_seeds():
    from peft import LoraConfig
    configs = {
        "qv.json": LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        "all_linear_rslora.json": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True,
                                             task_type="CAUSAL_LM"),
    }
    for name, config in configs.items():
        with tempfile.TemporaryDirectory() as tmp:
            config.base_model_name_or_path = "meta-llama/Llama-3.2-1B"
            config.save_pretrained(tmp)
            out("peft", name, pathlib.Path(f"{tmp}/adapter_config.json").read_bytes())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for d in CORPUS.glob("*/seed-*"):
        d.unlink()
    safetensors_seeds()
    pickle_seeds()
    strata_seeds(sys.argv[1])
    config_seeds()
    nanogpt_seeds()
    hf_seeds()
    tokenizer_seeds()
    instruct_seeds()
    peft_seeds()


if __name__ == "__main__":
    main()
