"""Fingerprints that tie a maps folder to the model and tokenizer it was fitted on.

A model fingerprint has the model's shape (architecture and sizes, from its HF config), a weight
fingerprint from the first 256 embedding rows and the final norm weight, and a per-layer fingerprint
from every decoder layer's input norm and the K and V rows of KV head 0 (the weights RidgeFill's fill
multiplies by). A fine-tune or a merged LoRA that leaves the embeddings alone still changes a layer.

Every weight is rounded to bf16 before hashing, so a bf16 checkpoint served in float32 (or a float32
checkpoint served in bf16) hashes identically, on any device. Beside each hash is a small sketch (fixed
+-1 projections), so a re-quantised copy of the same model is told apart from a different model: the
checksum differs but the sketch stays close (a warning), where a different model's sketch is far (an
error). Only the first 256 embedding rows are used because a runtime may pad its embedding beyond
``vocab_size``; only KV head 0 because, under tensor parallelism, rank 0 holds it whole and the norms
are replicated, so the served side can fingerprint the same rows without gathering shards.

The ``layers`` part (absent from folders written before it existed)::

    "layers": {
      "count": L,
      "sha256": "<hex>",              # over every layer's digest, in order
      "digests": ["<16 hex>", ...],    # per layer: sha256 of its bf16 norm, K rows and V rows
      "sketch": [[24 floats], ...],    # per layer: 8 projections each of norm, K rows, V rows
    }
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Mapping, Sequence

import torch

EMBED_ROWS = 256
SKETCH_DIM = 16
LAYER_SKETCH_DIM = 8  # projections per tensor and layer: 3 x 8 numbers per layer
LAYER_DIGEST_HEX = 16  # per-layer digest: enough to name the layers that changed
NAMED_LAYERS = 4  # an error or warning names this many layers, then counts the rest
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
# (input_norm_weight [d], k_rows [head_dim, d], v_rows [head_dim, d]) of one decoder layer.
LayerWeights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

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


def _signs(d: int, columns: int = SKETCH_DIM) -> torch.Tensor:
    """Fixed +-1 matrix ``[d, columns]`` from an integer hash: identical on every platform and version."""
    i = torch.arange(d, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(columns, dtype=torch.int64).unsqueeze(0)
    h = (i * 2654435761 + j * 40503 + 12345) % 4294967296
    h = (h ^ (h >> 13)) * 1274126177 % 4294967296
    return torch.where((h >> 7) & 1 == 1, 1.0, -1.0).to(torch.float64)


def _bf16(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` on the CPU, rounded to bf16 (through float32, so every source dtype rounds alike)."""
    return weight.detach().to("cpu", torch.float32).to(torch.bfloat16).contiguous()


def _rounded(values: torch.Tensor) -> list[float]:
    return [float(f"{v:.6g}") for v in values.reshape(-1).tolist()]


def weight_fingerprint(embed_weight: torch.Tensor, final_norm_weight: torch.Tensor) -> dict[str, Any]:
    """``embed_weight``: ``[vocab(+padding), d]``; ``final_norm_weight``: ``[d]``, any float dtype/device."""
    rows = min(EMBED_ROWS, embed_weight.shape[0])
    embed = _bf16(embed_weight[:rows])
    norm = _bf16(final_norm_weight.reshape(-1))
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
        "sketch": _rounded(sketch),
    }


def _layer_sketch(norm: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[3 * LAYER_SKETCH_DIM]``: ``norm @ S``, ``r @ K @ S`` and ``r @ V @ S`` for fixed +-1 ``r``, ``S``,
    each scaled to the size of one weight."""
    rows, d = k.shape
    columns = _signs(d, LAYER_SKETCH_DIM)
    row_signs = _signs(rows, LAYER_SKETCH_DIM + 1)[:, -1]
    return torch.cat([
        norm.double() @ columns / math.sqrt(d),
        row_signs @ k.double() @ columns / math.sqrt(rows * d),
        row_signs @ v.double() @ columns / math.sqrt(rows * d),
    ])


def layers_fingerprint(layers: Sequence[LayerWeights], hidden_size: int, head_dim: int) -> dict[str, Any]:
    """Per-layer fingerprint of ``layers`` (the ``"layers"`` part of :func:`model_fingerprint`).

    ``layers``: one ``(input_norm_weight [hidden_size], k_rows [head_dim, hidden_size], v_rows [head_dim,
    hidden_size])`` per decoder layer, in order, any float dtype and device. Raises ``ValueError`` on
    another shape (e.g. the K rows of every KV head instead of head 0).
    """
    overall = hashlib.sha256()
    digests, sketches = [], []
    for i, (norm_weight, k_weight, v_weight) in enumerate(layers):
        norm, k, v = _bf16(norm_weight), _bf16(k_weight), _bf16(v_weight)
        if tuple(norm.shape) != (hidden_size,):
            raise ValueError(f"layers[{i}]: input_norm_weight has shape {tuple(norm.shape)}, expected ({hidden_size},)")
        for name, t in (("k_rows", k), ("v_rows", v)):
            if tuple(t.shape) != (head_dim, hidden_size):
                raise ValueError(
                    f"layers[{i}]: {name} has shape {tuple(t.shape)}, expected {(head_dim, hidden_size)} "
                    "(head_dim rows of KV head 0 by hidden_size)"
                )
        digest = hashlib.sha256(f"{hidden_size}|{head_dim}|".encode())
        for t in (norm, k, v):
            digest.update(t.view(torch.int16).numpy().tobytes())
        overall.update(digest.digest())
        digests.append(digest.hexdigest()[:LAYER_DIGEST_HEX])
        sketches.append(_rounded(_layer_sketch(norm, k, v)))
    return {"count": len(digests), "sha256": overall.hexdigest(), "digests": digests, "sketch": sketches}


def model_fingerprint(
    config: Mapping[str, Any],
    embed_weight: torch.Tensor,
    final_norm_weight: torch.Tensor,
    layers: Sequence[LayerWeights] = (),
) -> dict[str, Any]:
    """Shape and weight fingerprint of a model.

    ``config``: an HF config dict (or ``PretrainedConfig``); ``embed_weight``: ``[vocab(+padding), d]``;
    ``final_norm_weight``: ``[d]``; ``layers``: per decoder layer, in order, ``(input_norm_weight [d],
    k_rows [head_dim, d], v_rows [head_dim, d])``, the layer's input RMSNorm weight and the rows of its K
    and V projections that produce KV head 0 (:func:`hf_fingerprint_layers` for an HF model). Without
    ``layers`` the fingerprint has no ``"layers"`` part, and a maps folder that records one refuses it.
    Returns a JSON-safe dict.
    """
    structure = _structure(_config_dict(config))
    fingerprint = {"kind": "model", **structure, "weights": weight_fingerprint(embed_weight, final_norm_weight)}
    if layers:
        d = embed_weight.shape[1]
        head_dim = structure["head_dim"] or layers[0][1].shape[0]
        fingerprint["layers"] = layers_fingerprint(layers, d, head_dim)
    return fingerprint


def hf_fingerprint_layers(model: Any) -> list[LayerWeights]:
    """The :func:`model_fingerprint` ``layers`` of a Hugging Face Llama/Qwen2/Qwen3/Qwen3.5/Qwen3-Next ``*ForCausalLM``.

    Per layer: ``(input_layernorm.weight [d], self_attn.k_proj.weight[:head_dim],
    self_attn.v_proj.weight[:head_dim])``, ``head_dim`` from the config or ``hidden_size //
    num_attention_heads``; for a Gated DeltaNet layer the first ``head_dim`` rows of the K and V blocks of
    its ``[q|k|v]`` projection (``gdn_layout.py``). Views, not copies (copies for Qwen3-Next's interleaved rows); no ``transformers`` import (any object of that shape works).
    """
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = []
    for layer in getattr(model, "model", model).layers:
        mixer = getattr(layer, "linear_attn", None)
        if mixer is not None:
            # A Gated DeltaNet layer: the first head_dim rows of the K and V blocks of its [q|k|v] projection.
            from ..gdn_layout import hf_qkv_weight

            w, kd = hf_qkv_weight(mixer), mixer.key_dim
            layers.append((layer.input_layernorm.weight, w[kd : kd + head_dim], w[2 * kd : 2 * kd + head_dim]))
            continue
        attn = layer.self_attn
        layers.append((layer.input_layernorm.weight, attn.k_proj.weight[:head_dim], attn.v_proj.weight[:head_dim]))
    return layers


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


def layer_distances(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[float]:
    """Per layer, the relative sketch distance between two ``"layers"`` parts (``0.0`` where the digests
    match): the largest over the layer's norm, K rows and V rows, so a change to one of them is not
    diluted by the others."""
    distances = []
    for digest_e, digest_a, sketch_e, sketch_a in zip(
        expected["digests"], actual["digests"], expected["sketch"], actual["sketch"], strict=True
    ):
        if digest_e == digest_a:
            distances.append(0.0)
            continue
        a = torch.tensor(sketch_e, dtype=torch.float64).reshape(3, -1)
        b = torch.tensor(sketch_a, dtype=torch.float64).reshape(3, -1)
        if a.shape != b.shape:
            distances.append(math.inf)
            continue
        distances.append(float(((a - b).norm(dim=1) / a.norm(dim=1).clamp_min(1e-30)).max()))
    return distances


def compare_fingerprints(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Compare the fingerprint a maps folder records (``expected``) with the served one (``actual``).

    Returns ``(errors, warnings)``, one line each. Every key the served side computes must be recorded,
    and equal (a missing one is an error; tokenizer BOS/EOS ids only warn); a key only the folder records
    is not compared. Weights and layers with equal checksums match; differing checksums with a close
    sketch are a warning (re-quantised or another precision), otherwise an error naming what differs. A
    folder without the per-layer part (written before it existed) is checked on embeddings and final
    norm only, with a warning.
    """
    kind = expected.get("kind", "model")
    errors: list[str] = []
    warnings: list[str] = []
    for key in sorted(set(actual) - {"kind", "weights", "layers"}):
        warn = kind == "tokenizer" and key in _TOKENIZER_WARN_KEYS
        if key not in expected:
            line = f"{kind} {key}: the maps folder's fingerprint does not record it; served {kind} has {actual[key]!r}"
        elif expected[key] != actual[key]:
            line = f"{kind} {key}: maps were fitted on {expected[key]!r}, served {kind} has {actual[key]!r}"
        else:
            continue
        (warnings if warn else errors).append(line)
    if errors or kind != "model":
        return errors, warnings
    for compare in (_compare_weights, _compare_layers):
        errors_part, warnings_part = compare(expected, actual)
        errors += errors_part
        warnings += warnings_part
    return errors, warnings


def _compare_weights(expected_model: Mapping[str, Any], actual_model: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    if "weights" not in actual_model:
        return [], []
    if "weights" not in expected_model:
        return [
            "model weights: the maps folder's fingerprint does not record them, so the weights cannot be checked"
        ], []
    expected, actual = expected_model["weights"], actual_model["weights"]
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


def _named(layers: list[int]) -> str:
    """``layer 5``, ``layers 2, 7``, ``layers 0, 1, 2, 3 and 2 more``."""
    if len(layers) == 1:
        return f"layer {layers[0]}"
    rest = len(layers) - NAMED_LAYERS
    return f"layers {', '.join(map(str, layers[:NAMED_LAYERS]))}" + (f" and {rest} more" if rest > 0 else "")


def _distance(distances: list[float], fmt: str) -> str:
    worst = format(max(distances), fmt)
    return f"relative sketch distance {worst}" if len(distances) == 1 else f"relative sketch distance up to {worst}"


def _compare_layers(expected_model: Mapping[str, Any], actual_model: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    expected, actual = expected_model.get("layers"), actual_model.get("layers")
    if expected is None:
        return [], [
            "model layers: the maps folder records no per-layer fingerprint (written by an older sgl-ridgefill), so "
            "only the embeddings and final norm were checked against the served model; record one with "
            "`sgl-ridgefill calibrate fingerprint --maps MAPS --model MODEL`"
        ]
    if actual is None:
        return [
            "model layers: the maps folder records a per-layer fingerprint but the served model's fingerprint has "
            "none, so the layers cannot be checked"
        ], []
    if expected["count"] != actual["count"]:
        return [
            f"model layers: the maps folder fingerprints {expected['count']} layers, the served model's fingerprint "
            f"has {actual['count']}"
        ], []
    if expected["sha256"] == actual["sha256"]:
        return [], []
    distances = layer_distances(expected, actual)
    far = [i for i, d in enumerate(distances) if d > WEIGHTS_CLOSE]
    if far:
        return [
            f"model {_named(far)}: weights differ from the model the maps were fitted on "
            f"({_distance([distances[i] for i in far], '.0%')}); the maps do not fit the served model"
        ], []
    close = [i for i, (a, b) in enumerate(zip(expected["digests"], actual["digests"])) if a != b]
    if not close:  # every per-layer digest matches, their checksum does not: the manifest was edited
        return ["model layers: the per-layer digests match but their checksum does not; the fingerprint was edited"], []
    return [], [
        f"model {_named(close)}: checksum differs but the weights are close "
        f"({_distance([distances[i] for i in close], '.2%')}); the served model looks re-quantised, converted or "
        "lightly fine-tuned from the one the maps were fitted on, so fills may be less accurate"
    ]

