"""Terminal-state offsets in a maps folder: ``ΔM_l`` of the terminal-state correction (hybrid models).

A file (default ``terminal_state.safetensors``, the name a policy's ``correct terminal_state(offsets=...)``
gives) holds, per split ``S`` and filling arm ``A`` it was measured for and per upper Gated DeltaNet layer
``l``::

    split{S}.{A}.layer.{l}     [HV, V, K] float32: the mean of (exact state - filled state)

in SGLang's state layout (``MambaPool.temporal``: value rows, key columns). ``ΔM_l`` is a full matrix per
value head, not one number per head: a state difference is a matrix, and a scalar per head would keep only
its component along the state itself. The manifest lists the file's sha256 under ``files`` (so
``load_maps`` verifies it) and records how it was measured under ``terminal_state[name]``: the prompts,
interval, snapshots, split, arm, the maps it was measured with, and the model fingerprint.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import torch

from .format import MANIFEST, MapsError, sha256_file

DEFAULT_FILE = "terminal_state.safetensors"


def offset_key(split: int, arm: str, layer: int) -> str:
    return f"split{split}.{arm}.layer.{layer}"


def _check_name(name: str) -> None:
    if pathlib.PurePath(name).name != name or name in (".", "..") or not name.endswith(".safetensors"):
        raise MapsError(f"terminal-state offsets file {name!r} must be a .safetensors file name inside the maps folder")


def write_terminal_offsets(folder: str | os.PathLike[str], offsets: Mapping[int, torch.Tensor], *, split: int, arm: str,
                           record: Mapping[str, Any], name: str = DEFAULT_FILE) -> pathlib.Path:
    """Add (or replace) the offsets of ``split``/``arm`` in the file ``name`` of the maps folder ``folder``.

    ``offsets``: upper GDN layer -> ``[HV, V, K]``; ``record``: how they were measured (JSON-safe). Other
    splits and arms already in the file stay. The manifest is rewritten atomically.
    """
    from safetensors.torch import load_file, save_file

    _check_name(name)
    folder = pathlib.Path(folder)
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    path = folder / name
    tensors = dict(load_file(path)) if path.is_file() else {}
    prefix = f"split{split}.{arm}."
    tensors = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
    for layer, delta in offsets.items():
        tensors[offset_key(split, arm, int(layer))] = delta.detach().to("cpu", torch.float32).contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, tmp)
    tmp.replace(path)
    manifest.setdefault("files", {})[name] = sha256_file(path)
    entries = manifest.setdefault("terminal_state", {}).setdefault(name, {})
    entries[f"split{split}.{arm}"] = {"split": split, "arm": arm, "layers": sorted(int(l) for l in offsets),
                                      **dict(record)}
    tmp_manifest = manifest_path.with_suffix(".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp_manifest.replace(manifest_path)
    return path


def terminal_entries(manifest: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """``(file, split, arm)`` of every set of offsets a maps folder's manifest records."""
    out = []
    for name, entries in (manifest.get("terminal_state") or {}).items():
        for entry in entries.values():
            out.append((name, int(entry["split"]), str(entry["arm"])))
    return sorted(out)


def read_terminal_offsets(folder: str | os.PathLike[str], name: str = DEFAULT_FILE, *, device: Any = "cpu",
                          ) -> dict[tuple[int, str], dict[int, torch.Tensor]]:
    """``(split, arm) -> {layer: ΔM_l [HV, V, K] float32}`` from the file ``name`` (its sha256 is checked
    against the manifest). Raises :class:`MapsError` when the manifest does not list it."""
    from safetensors.torch import load_file

    _check_name(name)
    folder = pathlib.Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    expected = (manifest.get("files") or {}).get(name)
    if expected is None or name not in (manifest.get("terminal_state") or {}):
        raise MapsError(f"maps folder {folder} holds no terminal-state offsets {name!r}")
    if sha256_file(folder / name) != expected:
        raise MapsError(f"maps folder {folder}: {name} fails its sha256 check; the file was changed after it was written")
    tensors = load_file(folder / name)
    out: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for key, value in tensors.items():
        head, _, layer = key.rpartition(".layer.")
        split_text, _, arm = head.partition(".")
        out.setdefault((int(split_text.removeprefix("split")), arm), {})[int(layer)] = value.to(device, torch.float32)
    return out
