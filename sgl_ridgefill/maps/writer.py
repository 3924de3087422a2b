"""Write a maps folder: tensors, token counts and manifest, all or nothing.

Everything is written into a temporary sibling folder that is renamed into place at the end, so an
interrupted or failed write leaves nothing half-written under the target name; an existing folder is
replaced only with ``force=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterator, Mapping, Sequence

import torch
from safetensors.torch import save_file

from sgl_ridgefill.kernels.quant import DEFAULT_GROUP_SIZE, dequantize_int8_groupwise, quantize_int8_groupwise

from .fingerprint import LayerWeights, model_fingerprint
from .kinds import DEFAULT_KIND, MAP_KINDS
from .format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    QUANTS,
    TOKEN_COUNTS,
    MapsError,
    a_key,
    a_q_key,
    a_scale_key,
    b_key,
    sha256_file,
    split_file,
)


@dataclasses.dataclass(frozen=True)
class SplitMaps:
    """The maps of one split, stacked in layer order ``split..num_layers-1``.

    ``A``: ``[n_upper, d_out, d_in]`` (any float dtype, usually float64 from the solve);
    ``b``: ``[n_upper, d_out]``; ``info``: JSON-safe facts stored in the manifest's entry for this split
    (``lambda``, ``alpha``, held-out scores, ...).
    """

    split: int
    A: torch.Tensor
    b: torch.Tensor
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.A.dim() != 3:
            raise ValueError(f"split {self.split}: A must be [n_upper, d_out, d_in], got shape {tuple(self.A.shape)}")
        if tuple(self.b.shape) != tuple(self.A.shape[:2]):
            raise ValueError(
                f"split {self.split}: b has shape {tuple(self.b.shape)}, expected {tuple(self.A.shape[:2])} to match A"
            )


def _rel_error(exact: torch.Tensor, stored: torch.Tensor) -> float:
    exact = exact.double()
    return float((exact - stored.double()).norm() / exact.norm().clamp_min(1e-30))


def _split_tensors(maps: SplitMaps, quant: str, group_size: int) -> tuple[dict[str, torch.Tensor], float]:
    """Tensors of one split file and the worst per-layer relative Frobenius error of the stored ``A``."""
    tensors: dict[str, torch.Tensor] = {}
    worst = 0.0
    for offset in range(maps.A.shape[0]):
        layer = maps.split + offset
        a = maps.A[offset]
        if quant == "int8":
            q, scale = quantize_int8_groupwise(a.float(), group_size)
            tensors[a_q_key(layer)] = q
            tensors[a_scale_key(layer)] = scale
            stored = dequantize_int8_groupwise(q, scale, group_size, torch.float64)
        else:
            stored = a.to(torch.bfloat16).contiguous()
            tensors[a_key(layer)] = stored
        worst = max(worst, _rel_error(a, stored))
        tensors[b_key(layer)] = maps.b[offset].to(torch.float32).contiguous()
    return tensors, worst


@contextlib.contextmanager
def _atomic_folder(out_dir: pathlib.Path, *, force: bool) -> Iterator[pathlib.Path]:
    """Yield a temporary folder that becomes ``out_dir`` when the block succeeds."""
    if out_dir.exists() and not force:
        raise MapsError(f"maps folder {out_dir} already exists (use --force to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, old / "replaced")
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_maps_folder(
    out_dir: str | os.PathLike[str],
    splits: Sequence[SplitMaps],
    *,
    model: Mapping[str, Any],
    tokenizer: Mapping[str, Any] | None = None,
    quant: str = "bf16",
    group_size: int = DEFAULT_GROUP_SIZE,
    default_split: int | None = None,
    calibration: Mapping[str, Any] | None = None,
    token_counts: torch.Tensor | None = None,
    stats_dir: str | os.PathLike[str] | None = None,
    map_kind: str = DEFAULT_KIND,
    sink: Mapping[str, Any] | None = None,
    calibration_dtype: str | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Write a complete maps folder and return its path.

    ``model``/``tokenizer``: fingerprints from :func:`model_fingerprint` / :func:`tokenizer_fingerprint`
    (``model["num_hidden_layers"]`` gives ``L``); ``splits``: one :class:`SplitMaps` per split, each with
    ``L - split`` layers and the same ``d_in``/``d_out``; ``quant``: ``"bf16"`` or ``"int8"`` (group-wise
    along ``d_in``, ``group_size`` columns per scale); ``calibration``: corpus summary for the manifest;
    ``token_counts``: ``[vocab]`` raw unigram counts; ``stats_dir``: where the sufficient statistics were
    kept; ``map_kind``: what the maps predict from what (``kinds.py``); ``sink``: the rule of the rows left
    out of the fit (``{"first_rows": k, "norm_ratio": r}``; the runtime runs them exactly);
    ``calibration_dtype``: the dtype the model ran in while the statistics were read (``"bfloat16"`` or
    ``"float32"``; the maps serve the model in either, since fingerprints round weights to bf16). Raises
    :class:`MapsError` if ``out_dir`` exists and ``force`` is false, ``ValueError`` on inconsistent inputs;
    on any failure nothing is left at ``out_dir``.
    """
    out_dir = pathlib.Path(out_dir)
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {quant!r}")
    if not splits:
        raise ValueError("write_maps_folder needs at least one split")
    if map_kind not in MAP_KINDS:
        raise ValueError(f"map_kind must be one of {', '.join(MAP_KINDS)}, got {map_kind!r}")
    num_layers = model.get("num_hidden_layers")
    if not isinstance(num_layers, int) or num_layers < 2:
        raise ValueError(f"model fingerprint has num_hidden_layers {num_layers!r}; expected an integer >= 2")
    d_out, d_in = splits[0].A.shape[1:]
    seen: set[int] = set()
    for maps in splits:
        if not 1 <= maps.split <= num_layers - 1:
            raise ValueError(f"split {maps.split} is outside 1..{num_layers - 1} for a model with {num_layers} layers")
        if maps.split in seen:
            raise ValueError(f"split {maps.split} is given twice")
        seen.add(maps.split)
        expected = (num_layers - maps.split, d_out, d_in)
        if tuple(maps.A.shape) != expected:
            raise ValueError(f"split {maps.split}: A has shape {tuple(maps.A.shape)}, expected {expected}")
    if default_split is None:
        default_split = min(seen)
    if default_split not in seen:
        raise ValueError(f"default_split {default_split} is not one of the splits {sorted(seen)}")

    from sgl_ridgefill import __version__

    with _atomic_folder(out_dir, force=force) as tmp:
        files: dict[str, str] = {}
        entries: dict[str, Any] = {}
        for maps in sorted(splits, key=lambda m: m.split):
            tensors, worst = _split_tensors(maps, quant, group_size)
            name = split_file(maps.split)
            save_file(tensors, str(tmp / name), metadata={"format": FORMAT_NAME, "split": str(maps.split), "quant": quant})
            files[name] = sha256_file(tmp / name)
            entries[str(maps.split)] = {
                "file": name,
                "layers": list(range(maps.split, num_layers)),
                "quant": quant,
                "group_size": group_size if quant == "int8" else None,
                "storage_max_rel_error": worst,
                **dict(maps.info),
            }
        counts_entry = None
        if token_counts is not None:
            counts = token_counts.detach().to("cpu", torch.int64).reshape(-1).contiguous()
            save_file({"counts": counts}, str(tmp / TOKEN_COUNTS), metadata={"format": FORMAT_NAME})
            files[TOKEN_COUNTS] = sha256_file(tmp / TOKEN_COUNTS)
            counts_entry = {"file": TOKEN_COUNTS, "vocab_size": counts.numel(), "total": int(counts.sum())}
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created_by": f"sgl-ridgefill {__version__}",
            "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": dict(model),
            "tokenizer": dict(tokenizer) if tokenizer is not None else None,
            "num_layers": num_layers,
            "d_in": int(d_in),
            "d_out": int(d_out),
            "map_kind": map_kind,
            "sink": dict(sink) if sink is not None else None,
            "default_split": default_split,
            "splits": entries,
            "calibration": dict(calibration) if calibration is not None else None,
            "calibration_dtype": calibration_dtype,
            "stats_dir": str(pathlib.Path(stats_dir).resolve()) if stats_dir is not None else None,
            "token_counts": counts_entry,
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out_dir


def identity_maps_folder(
    out_dir: str | os.PathLike[str],
    *,
    config: Mapping[str, Any],
    embed_weight: torch.Tensor,
    final_norm_weight: torch.Tensor,
    split: int,
    layers: Sequence[LayerWeights] = (),
    tokenizer: Any | None = None,
    quant: str = "bf16",
    token_counts: torch.Tensor | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Write a valid maps folder whose maps are ``A = I``, ``b = 0`` for every upper layer.

    With it, RidgeFill must reproduce identity fill exactly (a runtime test oracle). ``config``: HF
    config dict; ``embed_weight``: ``[vocab, d]``; ``final_norm_weight``: ``[d]``; ``layers``: per layer
    ``(input_norm_weight, k_rows, v_rows)`` as :func:`model_fingerprint` takes them
    (:func:`hf_fingerprint_layers` of an HF model); ``tokenizer``: an HF tokenizer to fingerprint, or ``None``.
    """
    from .fingerprint import tokenizer_fingerprint

    fingerprint = model_fingerprint(config, embed_weight, final_norm_weight, layers)
    num_layers, d = fingerprint["num_hidden_layers"], fingerprint["hidden_size"]
    if not isinstance(split, int) or not 1 <= split <= num_layers - 1:
        raise ValueError(f"split {split!r} is outside 1..{num_layers - 1} for a model with {num_layers} layers")
    n_upper = num_layers - split
    maps = SplitMaps(
        split,
        torch.eye(d, dtype=torch.float32).expand(n_upper, d, d).contiguous(),
        torch.zeros(n_upper, d, dtype=torch.float32),
        {"lambda": None, "kind": "identity"},
    )
    return write_maps_folder(
        out_dir,
        [maps],
        model=fingerprint,
        tokenizer=tokenizer_fingerprint(tokenizer) if tokenizer is not None else None,
        quant=quant,
        calibration={"kind": "identity", "documents": 0, "tokens": 0, "longest_document_tokens": 0},
        token_counts=token_counts,
        force=force,
    )


def refingerprint_maps_folder(
    path: str | os.PathLike[str],
    *,
    model: Mapping[str, Any],
    tokenizer: Mapping[str, Any] | None = None,
    force: bool = False,
) -> list[str]:
    """Record ``model`` (and ``tokenizer``) fingerprints in the existing maps folder at ``path``.

    For folders written before per-layer fingerprints, or with none: the maps stay as they are, only
    ``manifest.json`` is replaced (atomically). The folder must hold maps of the model's depth and width;
    a fingerprint it already records must match ``model`` (the warnings of that check are returned), unless
    ``force``. Raises :class:`MapsError` otherwise.
    """
    from .reader import load_maps

    if "layers" not in model:
        raise ValueError("the model fingerprint has no per-layer part; compute it with model_fingerprint(..., layers)")
    folder = load_maps(path)
    layers, d = model.get("num_hidden_layers"), model.get("hidden_size")
    if (folder.num_layers, folder.d_in, folder.d_out) != (layers, d, d):
        raise MapsError(
            f"maps folder {folder.path} holds maps for {folder.num_layers} layers of width {folder.d_in} -> "
            f"{folder.d_out}; the model has {layers} layers of width {d}, so its fingerprint cannot be recorded there"
        )
    warnings: list[str] = []
    if not force:
        try:
            if folder.manifest["model"] is not None:
                warnings += folder.check_model(model)
            if tokenizer is not None and folder.manifest.get("tokenizer") is not None:
                warnings += folder.check_tokenizer(tokenizer)
        except MapsError as exc:
            raise MapsError(f"{exc}; pass --force to record the new model's fingerprint anyway") from None
    manifest = dict(folder.manifest)
    manifest["model"] = dict(model)
    if tokenizer is not None:
        manifest["tokenizer"] = dict(tokenizer)
    tmp = folder.path / f".{MANIFEST}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, folder.path / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)
    return warnings
