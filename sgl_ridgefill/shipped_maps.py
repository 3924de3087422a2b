"""Maps fitted once and installed with the package (``sgl_ridgefill/demo_maps/``), and the check that they
fit the model this machine converted.

A shipped folder is an ordinary maps folder: :func:`check_fit` opens it with every file's sha256 checked
against its manifest, then compares the manifest's model and tokenizer fingerprints with those of the
converted model folder, exactly as a server started with ``--ridgefill-maps`` does. Converting the same
GGUF with the same ``transformers`` gives the same bf16 weights, so the fingerprints match on a fresh
machine; a ``transformers`` that dequantises differently changes them, and the caller fits its own maps.
"""

from __future__ import annotations

import dataclasses
import pathlib

SHIPPED_ROOT = pathlib.Path(__file__).resolve().parent / "demo_maps"


@dataclasses.dataclass(frozen=True)
class ShippedMaps:
    """One shipped folder: the model (a ``sgl-ridgefill model`` name) and the splits it serves (the first is
    its default), and how it was fitted (recorded in its manifest too)."""

    model: str
    splits: tuple[int, ...]
    folder: str
    quant: str = "int8"
    corpus: str = "builtin"
    tokens: int = 200_000

    @property
    def path(self) -> pathlib.Path:
        return SHIPPED_ROOT / self.folder


SHIPPED: tuple[ShippedMaps, ...] = (
    # Split 14 serves the long prompts of the qwen2.5-0.5b-rows policy (``split 14 from 12288 tokens``).
    ShippedMaps("qwen2.5-coder-0.5b", (12, 14), "qwen2.5-coder-0.5b-s12"),
)


def shipped_maps(model: str, split: int) -> ShippedMaps | None:
    """The shipped maps of ``model`` at ``split`` whose folder is installed, else ``None``."""
    for entry in SHIPPED:
        if entry.model == model and split in entry.splits and (entry.path / "manifest.json").is_file():
            return entry
    return None


@dataclasses.dataclass(frozen=True)
class Fit:
    """Whether a maps folder serves a model folder: ``ok``, and the reason (mismatch) or the checks'
    warnings (match)."""

    ok: bool
    reason: str = ""
    warnings: tuple[str, ...] = ()
    summary: str = ""  # how the folder was fitted, from its manifest (when it opened)


def check_fit(maps_dir: pathlib.Path, model_dir: pathlib.Path, *, fingerprints=None) -> Fit:
    """Open ``maps_dir`` (sha256 of every file) and compare its fingerprints with ``model_dir``'s.

    ``fingerprints``: ``(model, tokenizer)`` fingerprints of ``model_dir`` when already computed (else they
    are computed: the model loads in transformers, a few seconds). Mismatches the server would refuse make
    ``ok`` false; what it would only warn about (weights close but not equal) stays ``ok`` with warnings.
    """
    from .maps import MapsError, load_maps

    try:
        folder = load_maps(maps_dir)
    except MapsError as exc:
        return Fit(False, str(exc))
    summary = describe(folder.manifest)
    if fingerprints is None:
        from .calibration.pipeline import model_folder_fingerprints

        fingerprints = model_folder_fingerprints(model_dir)
    model_fp, tokenizer_fp = fingerprints
    try:
        warnings = folder.check_model(model_fp) + folder.check_tokenizer(tokenizer_fp)
    except MapsError as exc:
        return Fit(False, str(exc), summary=summary)
    return Fit(True, warnings=tuple(warnings), summary=summary)


def describe(manifest) -> str:
    """``int8, split 12 (also 14), 200K tokens of builtin, fitted in bfloat16``: how a maps folder was fitted
    (its default split first)."""
    calibration = manifest.get("calibration") or {}
    split = manifest.get("default_split")
    others = sorted(int(s) for s in (manifest.get("splits") or {}) if str(s).isdigit() and int(s) != split)
    also = f" (also {', '.join(str(s) for s in others)})" if others else ""
    quant = (manifest.get("splits") or {}).get(str(split), {}).get("quant", "?")
    corpus = (calibration.get("corpus") or {}).get("name", "?")
    tokens = calibration.get("tokens")
    dtype = manifest.get("calibration_dtype") or calibration.get("dtype") or "?"
    amount = f"{tokens / 1000:.0f}K tokens" if isinstance(tokens, int) else "? tokens"
    return f"{quant}, split {split}{also}, {amount} of {corpus}, fitted in {dtype}"
