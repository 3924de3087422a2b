"""Small synthetic fingerprints and maps for maps-folder tests, and a tiny random HF Llama."""

from __future__ import annotations

import copy

import torch

from sgl_ridgefill.maps import SplitMaps, model_fingerprint
from sgl_ridgefill.maps.fingerprint import hf_fingerprint_layers

NUM_LAYERS = 4
D = 48
HEAD_DIM = D // 4
VOCAB = 300


def config(**overrides):
    base = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": NUM_LAYERS,
        "hidden_size": D,
        "intermediate_size": 2 * D,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
    }
    base.update(overrides)
    return base


def weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    embed = (torch.randn(VOCAB, D, generator=g) * 0.05).to(torch.bfloat16)
    norm = (1.0 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16)
    return embed, norm


def layer_weights(seed: int = 0, num_layers: int = NUM_LAYERS):
    """Per layer ``(input_norm [D], k_rows [HEAD_DIM, D], v_rows [HEAD_DIM, D])`` in bf16."""
    g = torch.Generator().manual_seed(1000 + seed)
    return [
        (
            (1.0 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16),
            (0.05 * torch.randn(HEAD_DIM, D, generator=g)).to(torch.bfloat16),
            (0.05 * torch.randn(HEAD_DIM, D, generator=g)).to(torch.bfloat16),
        )
        for _ in range(num_layers)
    ]


def fingerprint(seed: int = 0, *, layers: bool = True, **overrides):
    """A synthetic model fingerprint; ``layers=False`` gives one as written before per-layer fingerprints."""
    embed, norm = weights(seed)
    cfg = config(**overrides)
    per_layer = layer_weights(seed, cfg["num_hidden_layers"]) if layers else ()
    return model_fingerprint(cfg, embed, norm, per_layer)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random 6-layer HF Llama (d=64, 4 heads, 2 KV heads, head_dim 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=300)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # HF initialises every RMSNorm to ones; real checkpoints' norms differ per layer
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def hf_fingerprint(model):
    return model_fingerprint(
        model.config.to_dict(), model.model.embed_tokens.weight, model.model.norm.weight, hf_fingerprint_layers(model)
    )


def perturbed(model, relative: float, seed: int = 0, only=None):
    """A copy of ``model`` whose parameters (those named by ``only``, default all) are scaled by ``1 + relative * N(0, 1)``."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if only is None or name in only:
                p.mul_(1 + relative * torch.randn(p.shape, generator=g).to(p.dtype))
    return out


def random_split(split: int, seed: int = 0) -> SplitMaps:
    g = torch.Generator().manual_seed(100 + seed)
    n_upper = NUM_LAYERS - split
    A = torch.randn(n_upper, D, D, generator=g, dtype=torch.float64) * 0.1
    b = torch.randn(n_upper, D, generator=g, dtype=torch.float64)
    return SplitMaps(split, A, b, {"lambda": 0.03})
