"""``sgl-ridgefill calibrate terminal-state``: measure ``ΔM_l`` of the terminal-state correction.

For a hybrid model (Gated DeltaNet layers; Qwen3.5) and a maps folder, on prompts kept apart from the
maps' calibration (documents the statistics pass neither read nor held out), every ``interval`` tokens the
state of each upper GDN layer ``l`` is taken twice: *exact* (the layer's true inputs ``x_l``) and *filled*
(``x̂_l`` from the maps for every row: no tail, no exact rows), both from an empty state. ``ΔM_l`` is the
mean of ``exact - filled`` over all snapshots of all prompts, one ``[HV, V, K]`` matrix per layer (SGLang's
state layout): a full matrix per value head, since the state the correction shifts is a matrix.

The states come from the unmodified Hugging Face model's layer weights through the same pure-PyTorch conv
and chunked gated delta rule as the CPU serving path (``gdn_ops.py``), in float32. Nothing here imports
SGLang.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import torch

from sgl_ridgefill import gdn_ops
from sgl_ridgefill.gdn_layout import hf_projections

from .capture import capture_layer_inputs, decoder_layers
from .config import CalibrationError
from .targets import recurrent_layers

DEFAULT_PROMPTS = 13  # the paper's count
DEFAULT_INTERVAL = 2048  # the paper's spacing of snapshots
DEFAULT_PROMPT_TOKENS = 32768


def _log(message: str) -> None:
    print(f"[sgl-ridgefill] {message}", file=sys.stderr, flush=True)


@torch.no_grad()
def state_snapshots(model: torch.nn.Module, layer_id: int, x_in: torch.Tensor, at: list[int]) -> torch.Tensor:
    """The recurrent state of GDN layer ``layer_id`` after rows ``[0, t)`` for each ``t`` in ``at`` (ascending,
    ``<= rows``), from an empty state, for rows whose layer inputs are ``x_in`` (``[rows, d]``).

    Returns ``[len(at), HV, V, K]`` float32 in host memory; the recurrence runs on the layer's device."""
    layer = decoder_layers(model)[layer_id]
    mix = layer.linear_attn
    x = x_in.to(layer.input_layernorm.weight.device, layer.input_layernorm.weight.dtype)
    h = layer.input_layernorm(x[None])[0]
    mixed, _, b, a = (t.float() for t in hf_projections(mix, h))
    rows, device = mixed.shape[0], mixed.device  # the layer's device (a spread model: any of them)
    weight = mix.conv1d.weight.reshape(mix.conv_dim, -1).float()
    bias = None if mix.conv1d.bias is None else mix.conv1d.bias.float()
    window = torch.zeros(1, mix.conv_dim, weight.shape[1] - 1, device=device)
    index = lambda *values: torch.tensor(values, device=device)  # noqa: E731
    conv = gdn_ops.causal_conv1d_fn(mixed.T.contiguous(), weight, bias, window, index(0, rows),
                                    index(0), index(False), "silu").T
    q, k, v = conv.split([mix.key_dim, mix.key_dim, mix.value_dim], dim=-1)
    q = q.reshape(1, rows, -1, mix.head_k_dim)
    k = k.reshape(1, rows, -1, mix.head_k_dim)
    v = v.reshape(1, rows, -1, mix.head_v_dim)
    g, beta = gdn_ops.fused_gdn_gating(mix.A_log, a, b, mix.dt_bias)
    pool = torch.zeros(1, mix.num_v_heads, mix.head_v_dim, mix.head_k_dim, device=device)
    out, prev = [], 0
    for t in at:
        if t > prev:
            gdn_ops.chunk_gated_delta_rule(q[:, prev:t], k[:, prev:t], v[:, prev:t], g[:, prev:t], beta[:, prev:t],
                                           pool, index(0, t - prev), initial_state_indices=index(0))
        out.append(pool[0].clone())
        prev = t
    return torch.stack(out).cpu()


@dataclasses.dataclass
class TerminalMeasurement:
    offsets: dict[int, torch.Tensor]  # layer -> ΔM [HV, V, K]
    snapshots: int  # states averaged per layer
    prompt_tokens: list[int]


@torch.no_grad()
def measure_offsets(model: torch.nn.Module, maps: tuple[torch.Tensor, torch.Tensor] | None, split: int,
                    prompts: list[list[int]], interval: int) -> TerminalMeasurement:
    """``ΔM_l`` for every GDN layer at or above ``split``. ``maps``: ``(A [L - S, d, d], b [L - S, d])`` for the
    ``ridgefill`` arm, ``None`` for ``identity`` (``x̂_l = x_S``); ``prompts``: token ids, each at least
    ``interval`` long."""
    layers = [l for l in recurrent_layers(model) if l >= split]
    if not layers:
        raise CalibrationError(f"the model has no Gated DeltaNet layer at or above split {split}")
    sums = {l: None for l in layers}
    count = 0
    lengths = []
    for ids in prompts:
        at = list(range(interval, len(ids) + 1, interval))
        if not at:
            continue
        xs = capture_layer_inputs(model, torch.tensor(ids, dtype=torch.long), [split, *layers])
        x_split = xs[split].float()
        for l in layers:
            if maps is None:
                x_hat = x_split
            else:
                a, b = (m[l - split].to(x_split.device, torch.float32) for m in maps)
                x_hat = x_split @ a.T + b
            diff = (state_snapshots(model, l, xs[l].float(), at) - state_snapshots(model, l, x_hat, at)).sum(0)
            sums[l] = diff if sums[l] is None else sums[l] + diff
        count += len(at)
        lengths.append(len(ids))
    if not count:
        raise CalibrationError(f"no prompt has {interval} tokens: nothing to measure")
    return TerminalMeasurement({l: s / count for l, s in sums.items()}, count, lengths)


def _prompts(corpus_spec: str, tokenizer: Any, manifest: dict, *, count: int, interval: int, max_tokens: int,
             seed: int) -> tuple[list[str], list[list[int]]]:
    """``count`` documents the maps' statistics pass neither read nor held out, at least ``interval`` tokens
    long, each cut to ``max_tokens``, in the corpus's deterministic order."""
    from .corpus import open_corpus

    calibration = manifest.get("calibration") or {}
    used = set(calibration.get("read_ids") or ()) | set(calibration.get("heldout_ids") or ())
    ids, prompts = [], []
    for doc in open_corpus(corpus_spec).ordered(seed):
        if doc.id in used:
            continue
        tokens = tokenizer(doc.text(), add_special_tokens=True, verbose=False)["input_ids"][:max_tokens]
        if len(tokens) < interval:
            continue
        ids.append(doc.id)
        prompts.append(tokens)
        if len(prompts) == count:
            break
    if not prompts:
        raise CalibrationError(
            f"--corpus {corpus_spec}: no document outside the maps' calibration has {interval} tokens (--interval)"
        )
    return ids, prompts


def calibrate_terminal_state(maps_dir: pathlib.Path, model_spec: str, corpus: str, *, split: int | None = None,
                             arm: str = "ridgefill", prompts: int = DEFAULT_PROMPTS, interval: int = DEFAULT_INTERVAL,
                             prompt_tokens: int = DEFAULT_PROMPT_TOKENS, name: str | None = None,
                             dtype: str = "float32", seed: int = 0, device: str = "auto", log=_log) -> pathlib.Path:
    """Measure ``ΔM`` for ``split`` (default: the folder's default split) and ``arm`` and store it in the maps
    folder (``maps/terminal.py``); returns the offsets file. ``device``: where the model runs (``--device``,
    :func:`.device.place`)."""
    from sgl_ridgefill.maps import load_maps
    from sgl_ridgefill.maps.terminal import DEFAULT_FILE, write_terminal_offsets
    from sgl_ridgefill.models import resolve_model

    from .capture import load_model
    from .device import place
    from .pipeline import _hf_fingerprint

    if arm not in ("ridgefill", "identity"):
        raise CalibrationError(f"--arm must be ridgefill or identity (the arms that fill), got {arm!r}")
    if interval < 1 or prompts < 1:
        raise CalibrationError("--interval and --prompts must be positive")
    folder = load_maps(maps_dir)
    split = folder.default_split if split is None else split
    model_dir = resolve_model(model_spec)
    placement = place(device)
    log(placement.line())
    model, tokenizer, hf_config = load_model(model_dir, dtype, placement.device_map)
    problems = folder.check_model(_hf_fingerprint(model, hf_config))
    for problem in problems:
        log(f"maps folder {maps_dir}: {problem}")
    maps = folder.load_split(split, dtype=torch.float32) if arm == "ridgefill" else None
    doc_ids, token_ids = _prompts(corpus, tokenizer, dict(folder.manifest), count=prompts, interval=interval,
                                  max_tokens=prompt_tokens, seed=seed)
    log(f"measuring terminal-state offsets at split {split} ({arm}) on {len(token_ids)} prompt(s), every {interval} tokens")
    result = measure_offsets(model, maps, split, token_ids, interval)
    record = {
        "prompts": doc_ids,
        "prompt_tokens": result.prompt_tokens,
        "snapshots": result.snapshots,
        "interval": interval,
        "corpus": corpus,
        "maps_files": {k: v for k, v in folder.manifest["files"].items() if k.startswith("maps-split")},
        "model_dir": str(pathlib.Path(model_dir).resolve()),
        "dtype": dtype,
        "device": str(placement.stats_device),
        "seed": seed,
        "kept_apart": "documents outside the maps' calibration (read_ids) and held-out set (heldout_ids)",
    }
    path = write_terminal_offsets(maps_dir, result.offsets, split=split, arm=arm, record=record,
                                  name=name or DEFAULT_FILE)
    norms = ", ".join(f"{l}: {d.norm():.4g}" for l, d in sorted(result.offsets.items()))
    log(f"wrote {path} ({result.snapshots} states per layer; |ΔM| per layer {norms})")
    return path
