"""What ``policy check/explain --maps DIR`` reads from ``DIR/manifest.json``: read as plain JSON, leniently.

Only the facts the policy tools need (splits, layer count, map shapes and storage); the maps reader
(``sgl_ridgefill.maps``) is the one that verifies a folder before serving from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from .errors import PolicyError
from .targets import MapsInfo

MANIFEST = "manifest.json"
_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "int8": 1}


@dataclasses.dataclass(frozen=True)
class MapsFacts:
    """splits: {split: (quant, group_size or None)}; any field may be None when the manifest lacks it."""

    path: str
    num_layers: int | None
    default_split: int | None
    d_in: int | None
    d_out: int | None
    splits: dict[int, tuple[str, int | None]]

    def maps_info(self) -> MapsInfo | None:
        if self.num_layers is None or not self.splits:
            return None
        default = self.default_split if self.default_split in self.splits else min(self.splits)
        try:
            return MapsInfo(tuple(sorted(self.splits)), default, self.num_layers)
        except ValueError as err:
            raise PolicyError(f"maps manifest does not describe usable splits: {err}", filename=self.manifest_path) from None

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.path, MANIFEST)

    def map_bytes(self, split: int) -> tuple[int, str] | None:
        """Storage of the maps for ``split`` (A, scales and b for every upper layer) and its quant name."""
        if self.num_layers is None or self.d_in is None or self.d_out is None:
            return None
        quant, group = self.splits.get(split, ("bf16", None))
        per_elem = _BYTES.get(quant)
        if per_elem is None:
            return None
        per_layer = self.d_out * self.d_in * per_elem + self.d_out * 4
        if quant == "int8":
            per_layer += self.d_out * math.ceil(self.d_in / (group or 128)) * 4
        return (self.num_layers - split) * per_layer, quant


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def read_maps_facts(folder: str | os.PathLike) -> MapsFacts:
    """Read ``folder/manifest.json`` leniently; ``PolicyError`` if it is missing or not JSON."""
    path = pathlib.Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise PolicyError(f"cannot read the maps manifest: {err.strerror or err}", filename=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PolicyError(f"the maps manifest is not valid JSON: {err}", filename=str(path)) from None
    if not isinstance(manifest, Mapping):
        raise PolicyError("the maps manifest is not a JSON object", filename=str(path))
    raw = manifest.get("splits") or {}
    splits: dict[int, tuple[str, int | None]] = {}
    entries = raw.items() if isinstance(raw, Mapping) else ((s, {}) for s in raw if not isinstance(s, Mapping))
    for key, entry in entries:
        split = _int(key)
        if split is None:
            continue
        entry = entry if isinstance(entry, Mapping) else {}
        quant = str(entry.get("quant") or manifest.get("quant") or manifest.get("dtype") or "bf16")
        splits[split] = (quant, _int(entry.get("group_size")))
    return MapsFacts(
        path=str(folder),
        num_layers=_int(manifest.get("num_layers")),
        default_split=_int(manifest.get("default_split")),
        d_in=_int(manifest.get("d_in")),
        d_out=_int(manifest.get("d_out")),
        splits=splits,
    )
