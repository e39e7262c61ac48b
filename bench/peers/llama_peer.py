r"""The Llama half of gpt_peer.py: transformers' own LlamaForCausalLM as the PyTorch peer of strata's Llama family.

What a PyTorch user fine-tuning a Llama runs: transformers' model with SDPA attention, loaded from a
transformers directory (config.json + model.safetensors) that strata-gpt --init-from reads too, so both start
from the same weights. The loss is gpt_peer.py's: mean cross-entropy on fp32 logits. Activation checkpointing
wraps each decoder layer (torch.utils.checkpoint, use_reentrant=False), FSDP2 shards each decoder layer then
the root (torchtitan's order); everything else (data, optimiser, schedule, clipping, modes) is gpt_peer.py's.

  --write-init DIR  a random LlamaForCausalLM of --preset's shape (transformers' init, from --seed) over the
                    byte vocabulary (256), saved by save_pretrained: the shared initial weights.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# strata's small Llama presets (recipes/models/llama/presets.cpp: n_layer, n_head, n_embd, intermediate_size,
# n_kv_head; rms_norm_eps 1e-5, rope_theta 1e4, untied): what the peer suite runs.
LLAMA_PRESETS = {"llama-nano": (3, 3, 48, 128, 1), "llama-micro": (4, 4, 128, 352, 2),
                 "llama-mini": (6, 6, 192, 512, 2)}


def llama_config(a, vocab):
    from transformers import LlamaConfig
    n_layer, n_head, n_embd, ffn, kv = LLAMA_PRESETS[a.preset]
    return LlamaConfig(vocab_size=vocab, hidden_size=n_embd, intermediate_size=ffn, num_hidden_layers=n_layer,
                       num_attention_heads=n_head, num_key_value_heads=kv, max_position_embeddings=max(1024, a.block_size),
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                       mlp_bias=False, hidden_act="silu")


def write_llama_init(a, vocab):
    from transformers import LlamaForCausalLM
    torch.manual_seed(a.seed)
    LlamaForCausalLM(llama_config(a, vocab)).save_pretrained(a.write_init, safe_serialization=True)


class HFLlama(nn.Module):
    """LlamaForCausalLM with gpt_peer.py's call: forward(idx, targets) -> the mean loss."""

    def __init__(self, path, a):
        super().__init__()
        from transformers import LlamaForCausalLM
        self.hf = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
        self.activation_checkpointing = bool(a.activation_checkpointing)
        if a.ac_policy != "full":
            raise SystemExit("the Llama peer runs --ac-policy full only")

    def blocks(self):
        return self.hf.model.layers

    def forward(self, idx, targets):
        m = self.hf.model
        x = m.embed_tokens(idx)
        positions = torch.arange(idx.size(1), device=idx.device).unsqueeze(0)
        rope = m.rotary_emb(x, positions)
        for layer in m.layers:
            # transformers' decoder layer with SDPA's causal path (no mask tensor).
            call = lambda h, layer=layer: layer(h, attention_mask=None, position_ids=positions, position_embeddings=rope)
            out = checkpoint(call, x, use_reentrant=False) if self.activation_checkpointing else call(x)
            x = out[0] if isinstance(out, tuple) else out
        logits = self.hf.lm_head(m.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
