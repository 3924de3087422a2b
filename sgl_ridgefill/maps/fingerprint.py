"""Fingerprints that tie a maps folder to the model and tokenizer it was fitted on.

A model fingerprint has the model's shape (architecture and sizes, from its HF config) and a weight
fingerprint from the first 256 embedding rows and the final norm weight. The weight fingerprint is
dtype-robust: weights are rounded to bf16 before hashing, so a bf16 checkpoint served in float32 (or a
float32 checkpoint served in bf16) hashes identically. Beside the hash it keeps a small sketch (fixed
+-1 projections), so a re-quantised copy of the same model is told apart from a different model: the
checksum differs but the sketch stays close (a warning), where a different model's sketch is far (an
error). Only the first 256 rows are used because a runtime may pad its embedding beyond ``vocab_size``.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping

import torch

EMBED_ROWS = 256
SKETCH_DIM = 16
# Relative sketch distance below which differing checksums read as "same model, other quantisation".
# Re-quantising to 4 bits moves the sketch by a few percent; an unrelated model moves it by ~140 %.
WEIGHTS_CLOSE = 0.25

_STRUCTURE_KEYS = (
    "architecture",
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)
# Special token ids can be overridden by a server's own settings without changing what the map sees.
_TOKENIZER_WARN_KEYS = ("bos_token_id", "eos_token_id")


def _config_dict(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config must be a mapping or an HF PretrainedConfig, got {type(config).__name__}")


def _structure(config: Mapping[str, Any]) -> dict[str, Any]:
    architectures = config.get("architectures") or [None]
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    return {
        "architecture": architectures[0],
        "model_type": config.get("model_type"),
        "num_hidden_layers": config.get("num_hidden_layers"),
        "hidden_size": hidden,
        "intermediate_size": config.get("intermediate_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": config.get("num_key_value_heads", heads),
        "head_dim": head_dim,
        "vocab_size": config.get("vocab_size"),
    }


def _signs(d: int) -> torch.Tensor:
    """Fixed +-1 matrix ``[d, SKETCH_DIM]`` from an integer hash: identical on every platform and version."""
    i = torch.arange(d, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(SKETCH_DIM, dtype=torch.int64).unsqueeze(0)
    h = (i * 2654435761 + j * 40503 + 12345) % 4294967296
    h = (h ^ (h >> 13)) * 1274126177 % 4294967296
    return torch.where((h >> 7) & 1 == 1, 1.0, -1.0).to(torch.float64)


def weight_fingerprint(embed_weight: torch.Tensor, final_norm_weight: torch.Tensor) -> dict[str, Any]:
    """``embed_weight``: ``[vocab(+padding), d]``; ``final_norm_weight``: ``[d]``, any float dtype/device."""
    rows = min(EMBED_ROWS, embed_weight.shape[0])
    embed = embed_weight[:rows].detach().to("cpu", torch.float32).to(torch.bfloat16)
    norm = final_norm_weight.detach().reshape(-1).to("cpu", torch.float32).to(torch.bfloat16)
    digest = hashlib.sha256()
    digest.update(f"{tuple(embed.shape)}|{tuple(norm.shape)}|".encode())
    digest.update(embed.contiguous().view(torch.int16).numpy().tobytes())
    digest.update(norm.contiguous().view(torch.int16).numpy().tobytes())
    d = embed.shape[1]
    signs = _signs(d)
    sketch = torch.cat([embed.double() @ signs, (norm.double() @ signs).unsqueeze(0)]) / math.sqrt(d)
    return {
        "rows": rows,
        "dtype": str(embed_weight.dtype).removeprefix("torch."),
        "sha256": digest.hexdigest(),
        "sketch": [float(f"{v:.6g}") for v in sketch.reshape(-1).tolist()],
    }


def model_fingerprint(
    config: Mapping[str, Any], embed_weight: torch.Tensor, final_norm_weight: torch.Tensor
) -> dict[str, Any]:
    """Shape and weight fingerprint of a model.

    ``config``: an HF config dict (or ``PretrainedConfig``); ``embed_weight``: ``[vocab(+padding), d]``;
    ``final_norm_weight``: ``[d]``. Returns a JSON-safe dict.
    """
    return {"kind": "model", **_structure(_config_dict(config)), "weights": weight_fingerprint(embed_weight, final_norm_weight)}


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """Vocabulary size, a sha256 of the ``token -> id`` table (added tokens included), BOS/EOS ids."""
    vocab = tokenizer.get_vocab()
    table = sorted(vocab.items(), key=lambda item: (item[1], item[0]))
    digest = hashlib.sha256(json.dumps(table, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
    return {
        "kind": "tokenizer",
        "vocab_size": len(vocab),
        "vocab_sha256": digest,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def sketch_distance(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> float:
    """Relative L2 distance between two weight sketches (``inf`` when their shapes differ)."""
    a = torch.tensor(expected["sketch"], dtype=torch.float64)
    b = torch.tensor(actual["sketch"], dtype=torch.float64)
    if a.shape != b.shape:
        return math.inf
    return float((a - b).norm() / a.norm().clamp_min(1e-30))


def compare_fingerprints(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Compare the fingerprint a maps folder records (``expected``) with the served one (``actual``).

    Returns ``(errors, warnings)``, one line each. A key present on one side only is not compared (a
    runtime may not know every field). Weights with equal checksums match; differing checksums with a
    close sketch are a warning (re-quantised or another precision), otherwise an error.
    """
    kind = expected.get("kind", "model")
    errors: list[str] = []
    warnings: list[str] = []
    for key in sorted(set(expected) & set(actual) - {"kind", "weights"}):
        if expected[key] == actual[key]:
            continue
        line = f"{kind} {key}: maps were fitted on {expected[key]!r}, served {kind} has {actual[key]!r}"
        (warnings if kind == "tokenizer" and key in _TOKENIZER_WARN_KEYS else errors).append(line)
    if "weights" in expected and "weights" in actual and not errors:
        errors_w, warnings_w = _compare_weights(expected["weights"], actual["weights"])
        errors += errors_w
        warnings += warnings_w
    return errors, warnings


def _compare_weights(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    if expected["sha256"] == actual["sha256"]:
        return [], []
    distance = sketch_distance(expected, actual)
    if distance <= WEIGHTS_CLOSE:
        return [], [
            f"model weights: checksum differs but the weights are close (relative sketch distance "
            f"{distance:.2%}); the served model ({actual.get('dtype')}) looks re-quantised or converted from "
            f"the one the maps were fitted on ({expected.get('dtype')}), so fills may be less accurate"
        ]
    return [
        f"model weights: checksum differs and the weights are far apart (relative sketch distance "
        f"{distance:.0%}); the served model is not the one the maps were fitted on"
    ], []


def __getattr__(name: str) -> Any:
    # The writer functions are documented next to the fingerprints they embed; they live in .writer
    # (which imports this module), so they are re-exported lazily to avoid an import cycle.
    if name in ("write_maps_folder", "identity_maps_folder"):
        from . import writer

        return getattr(writer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
