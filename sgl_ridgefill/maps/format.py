"""The maps folder format: file names, tensor names, manifest keys, and the checks every reader runs.

A maps folder::

    manifest.json                  format, version, model and tokenizer fingerprints, splits, scores,
                                   calibration summary and dtype (``calibration_dtype``; absent in
                                   older folders), sha256 of every other file; the map kind
                                   (``map_kind``, ``kinds.py``; absent: ``residual``) and the sink rule
                                   (``sink``: rows left out of the fit, served exactly; absent: none)
    maps-split{S}.safetensors      per upper layer l in [S, L):
                                     layer.{l}.A      [d_out, d_in] bf16            (quant "bf16")
                                     layer.{l}.A_q    [d_out, d_in] int8            (quant "int8")
                                     layer.{l}.A_scale [d_out, n_groups] f32        (quant "int8")
                                     layer.{l}.b      [d_out] f32
    token_counts.safetensors       counts [vocab] int64: raw unigram counts over the calibration
                                   documents (readers add one)

The sufficient statistics the maps were solved from live in a separate stats folder (they can be GBs);
the manifest records its path.

int8 maps are quantised group-wise along ``d_in`` (groups of ``group_size``, symmetric, scale =
max|A|/127 per group). Each element's error is at most half a step, so at most 1/254 (0.394 %) of the
largest magnitude in its group; the manifest records the measured worst relative Frobenius error per
split (``int8_max_rel_error``).
"""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any, Mapping

from .kinds import MAP_KINDS

FORMAT_NAME = "sgl-ridgefill-maps"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKEN_COUNTS = "token_counts.safetensors"
QUANTS = ("bf16", "int8")
INT8_ELEMENT_BOUND = 1.0 / 254.0  # worst |error| of one element relative to its group's max |A|

_REQUIRED_KEYS = ("format", "format_version", "model", "num_layers", "d_in", "d_out", "splits", "default_split", "files")
_REQUIRED_SPLIT_KEYS = ("file", "layers", "quant")


class MapsError(ValueError):
    """A maps folder is missing, malformed, tampered with, or does not fit the served model."""


def split_file(split: int) -> str:
    return f"maps-split{split}.safetensors"


def a_key(layer: int) -> str:
    return f"layer.{layer}.A"


def a_q_key(layer: int) -> str:
    return f"layer.{layer}.A_q"


def a_scale_key(layer: int) -> str:
    return f"layer.{layer}.A_scale"


def b_key(layer: int) -> str:
    return f"layer.{layer}.b"


def sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def validate_manifest(manifest: Any, where: pathlib.Path) -> None:
    """Raise :class:`MapsError` unless ``manifest`` has this version's shape.

    Checks keys and their internal consistency only; files and checksums are checked by the reader.
    """
    if not isinstance(manifest, Mapping):
        raise MapsError(f"maps folder {where}: {MANIFEST} is not a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise MapsError(
            f"maps folder {where}: {MANIFEST} has format {manifest.get('format')!r}, expected {FORMAT_NAME!r}"
        )
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise MapsError(
            f"maps folder {where}: format version {version!r} is not supported; this sgl-ridgefill reads "
            f"version {FORMAT_VERSION} (re-run calibration, or use a matching sgl-ridgefill)"
        )
    missing = [k for k in _REQUIRED_KEYS if k not in manifest]
    if missing:
        raise MapsError(f"maps folder {where}: {MANIFEST} lacks key(s) {', '.join(missing)}")
    num_layers = manifest["num_layers"]
    splits = manifest["splits"]
    if not isinstance(splits, Mapping) or not splits:
        raise MapsError(f"maps folder {where}: {MANIFEST} lists no splits")
    for key, entry in splits.items():
        if not str(key).isdigit():
            raise MapsError(f"maps folder {where}: split key {key!r} is not an integer")
        split = int(key)
        if not 1 <= split <= num_layers - 1:
            raise MapsError(f"maps folder {where}: split {split} is outside 1..{num_layers - 1}")
        lacking = [k for k in _REQUIRED_SPLIT_KEYS if k not in entry]
        if lacking:
            raise MapsError(f"maps folder {where}: split {split} lacks key(s) {', '.join(lacking)}")
        if list(entry["layers"]) != list(range(split, num_layers)):
            raise MapsError(
                f"maps folder {where}: split {split} lists layers {entry['layers']}, expected {split}..{num_layers - 1}"
            )
        if entry["quant"] not in QUANTS:
            raise MapsError(f"maps folder {where}: split {split} has quant {entry['quant']!r}, expected one of {QUANTS}")
        if entry["file"] not in manifest["files"]:
            raise MapsError(f"maps folder {where}: split {split}'s file {entry['file']} has no sha256 in 'files'")
    if str(manifest["default_split"]) not in splits:
        raise MapsError(f"maps folder {where}: default_split {manifest['default_split']} is not one of the splits")

    kind = manifest.get("map_kind")
    if kind is not None and kind not in MAP_KINDS:
        raise MapsError(f"maps folder {where}: map_kind {kind!r} is not one of {', '.join(MAP_KINDS)}")
    sink = manifest.get("sink")
    if sink is not None and (
        not isinstance(sink, Mapping) or not isinstance(sink.get("first_rows"), int)
        or not isinstance(sink.get("norm_ratio"), (int, float))
    ):
        raise MapsError(f"maps folder {where}: sink must be {{first_rows: int, norm_ratio: number}}, got {sink!r}")