"""Small synthetic fingerprints and maps for maps-folder tests (no model needed)."""

from __future__ import annotations

import torch

from sgl_ridgefill.maps import SplitMaps, model_fingerprint

NUM_LAYERS = 4
D = 48
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


def fingerprint(seed: int = 0, **overrides):
    embed, norm = weights(seed)
    return model_fingerprint(config(**overrides), embed, norm)


def random_split(split: int, seed: int = 0) -> SplitMaps:
    g = torch.Generator().manual_seed(100 + seed)
    n_upper = NUM_LAYERS - split
    A = torch.randn(n_upper, D, D, generator=g, dtype=torch.float64) * 0.1
    b = torch.randn(n_upper, D, generator=g, dtype=torch.float64)
    return SplitMaps(split, A, b, {"lambda": 0.03})
