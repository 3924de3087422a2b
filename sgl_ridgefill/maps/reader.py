"""Read a maps folder: verify the manifest and every file's sha256, then load maps per split."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping

import torch
from safetensors import safe_open

from sgl_ridgefill.kernels.quant import dequantize_int8_groupwise

from .fingerprint import compare_fingerprints
from .kinds import MapKind, map_kind
from .format import (
    MANIFEST,
    TOKEN_COUNTS,
    MapsError,
    a_key,
    a_q_key,
    a_scale_key,
    b_key,
    sha256_file,
    validate_manifest,
)


class MapsFolder:
    """A verified maps folder. Construct with :func:`load_maps`.

    Maps are read from disk on demand (:meth:`load_split`), so holding a ``MapsFolder`` costs only its
    manifest.
    """

    def __init__(self, path: pathlib.Path, manifest: Mapping[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self.splits: tuple[int, ...] = tuple(sorted(int(s) for s in manifest["splits"]))
        self.default_split: int = int(manifest["default_split"])
        self.num_layers: int = int(manifest["num_layers"])
        self.d_in: int = int(manifest["d_in"])
        self.d_out: int = int(manifest["d_out"])
        self.kind: MapKind = map_kind(manifest.get("map_kind"))
        # Rows left out of the fit and served exactly: {"first_rows": k, "norm_ratio": r}, or None.
        self.sink: Mapping[str, Any] | None = manifest.get("sink")

    def __repr__(self) -> str:
        return f"MapsFolder({str(self.path)!r}, splits={self.splits}, num_layers={self.num_layers})"

    def _entry(self, split: int) -> Mapping[str, Any]:
        try:
            return self.manifest["splits"][str(split)]
        except KeyError:
            raise MapsError(
                f"maps folder {self.path} has no maps for split {split}; it has split(s) "
                f"{', '.join(map(str, self.splits))}"
            ) from None

    @property
    def calibration_dtype(self) -> str | None:
        """The dtype the model ran in during calibration (``"bfloat16"``/``"float32"``), from the manifest's
        ``calibration_dtype`` or, in folders written before that field, the calibration summary's ``dtype``;
        ``None`` when neither records it. Informational: the maps serve the model in any dtype."""
        value = self.manifest.get("calibration_dtype")
        if value is None:
            value = (self.manifest.get("calibration") or {}).get("dtype")
        return value

    def layers(self, split: int) -> tuple[int, ...]:
        """The upper layers ``split..num_layers-1`` that split ``split`` fills."""
        self._entry(split)
        return tuple(range(split, self.num_layers))

    def quant(self, split: int) -> str:
        """``"bf16"`` or ``"int8"``: how the split's ``A`` is stored."""
        return self._entry(split)["quant"]

    def _read(self, split: int, keys: list[str]) -> dict[str, torch.Tensor]:
        path = self.path / self._entry(split)["file"]
        out = {}
        with safe_open(str(path), framework="pt", device="cpu") as f:
            present = set(f.keys())
            missing = [k for k in keys if k not in present]
            if missing:
                raise MapsError(f"maps folder {self.path}: {path.name} lacks tensor(s) {', '.join(missing[:4])}")
            for key in keys:
                out[key] = f.get_tensor(key)
        return out

    def _check_shape(self, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(tensor.shape) != shape:
            raise MapsError(f"maps folder {self.path}: tensor {name} has shape {tuple(tensor.shape)}, expected {shape}")

    def load_split(
        self, split: int, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A [n_upper, d_out, d_in], b [n_upper, d_out])`` in layer order, both in ``dtype`` on ``device``.

        int8 maps are dequantised to ``dtype``; use :meth:`load_split_int8` to keep them quantised.
        """
        layers = self.layers(split)
        entry = self._entry(split)
        A = torch.empty(len(layers), self.d_out, self.d_in, dtype=dtype)
        b = torch.empty(len(layers), self.d_out, dtype=dtype)
        for i, layer in enumerate(layers):
            if entry["quant"] == "int8":
                t = self._read(split, [a_q_key(layer), a_scale_key(layer), b_key(layer)])
                self._check_shape(a_q_key(layer), t[a_q_key(layer)], (self.d_out, self.d_in))
                A[i] = dequantize_int8_groupwise(t[a_q_key(layer)], t[a_scale_key(layer)], int(entry["group_size"]), dtype)
            else:
                t = self._read(split, [a_key(layer), b_key(layer)])
                self._check_shape(a_key(layer), t[a_key(layer)], (self.d_out, self.d_in))
                A[i] = t[a_key(layer)].to(dtype)
            self._check_shape(b_key(layer), t[b_key(layer)], (self.d_out,))
            b[i] = t[b_key(layer)].to(dtype)
        return A.to(device), b.to(device)

    def load_split_int8(self, split: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
        """``(q [n_upper, d_out, d_in] int8, scale [n_upper, d_out, n_groups] f32, b [n_upper, d_out] f32,
        group_size)``, or ``None`` when the split is stored in bf16."""
        entry = self._entry(split)
        if entry["quant"] != "int8":
            return None
        group_size = int(entry["group_size"])
        n_groups = -(-self.d_in // group_size)
        layers = self.layers(split)
        keys = [k for layer in layers for k in (a_q_key(layer), a_scale_key(layer), b_key(layer))]
        t = self._read(split, keys)
        for layer in layers:
            self._check_shape(a_q_key(layer), t[a_q_key(layer)], (self.d_out, self.d_in))
            self._check_shape(a_scale_key(layer), t[a_scale_key(layer)], (self.d_out, n_groups))
            self._check_shape(b_key(layer), t[b_key(layer)], (self.d_out,))
        q = torch.stack([t[a_q_key(layer)] for layer in layers])
        scale = torch.stack([t[a_scale_key(layer)].float() for layer in layers])
        b = torch.stack([t[b_key(layer)].float() for layer in layers])
        return q, scale, b, group_size

    def resident_bytes(self, split: int, *, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes the split's maps occupy once loaded: ``A`` and ``b`` in ``dtype``, or, with
        ``dtype=torch.int8``, the int8 ``q``, its float32 scales and a float32 ``b``."""
        n_upper = len(self.layers(split))
        entry = self._entry(split)
        if dtype == torch.int8:
            if entry["quant"] != "int8":
                raise MapsError(f"maps folder {self.path}: split {split} is stored in {entry['quant']}, not int8")
            n_groups = -(-self.d_in // int(entry["group_size"]))
            return n_upper * (self.d_out * self.d_in + 4 * self.d_out * n_groups + 4 * self.d_out)
        size = torch.empty((), dtype=dtype).element_size()
        return n_upper * (self.d_out * self.d_in + self.d_out) * size

    def token_counts(self) -> torch.Tensor | None:
        """Raw unigram counts ``[vocab]`` int64 over the calibration documents, or ``None``.

        Add one before turning them into frequencies (add-one smoothing is the reader's job).
        """
        if not self.manifest.get("token_counts"):
            return None
        with safe_open(str(self.path / TOKEN_COUNTS), framework="pt", device="cpu") as f:
            return f.get_tensor("counts")

    def _check(self, key: str, fingerprint: Mapping[str, Any]) -> list[str]:
        expected = self.manifest.get(key)
        if expected is None and key == "model":
            raise MapsError(
                f"maps folder {self.path} records no model fingerprint, so nothing ties it to the model it was fitted "
                f"on; re-fit it with `sgl-ridgefill calibrate`, or record the fingerprint of the model it was fitted "
                f"on with `sgl-ridgefill calibrate fingerprint --maps {self.path} --model MODEL`"
            )
        if expected is None:
            return [f"maps folder {self.path} records no {key} fingerprint; {key} not checked"]
        errors, warnings = compare_fingerprints(expected, fingerprint)
        if errors:
            raise MapsError(f"maps folder {self.path} does not match the served {key}: " + "; ".join(errors))
        return warnings

    def check_model(self, fingerprint: Mapping[str, Any]) -> list[str]:
        """Compare with the served model's :func:`model_fingerprint` (computed with ``layers``).

        Raises :class:`MapsError` naming every mismatch, and when the folder records no model fingerprint;
        returns warnings (e.g. only quantisation differs, or the folder predates per-layer fingerprints).
        """
        return self._check("model", fingerprint)

    def check_tokenizer(self, fingerprint: Mapping[str, Any]) -> list[str]:
        """Compare with the served tokenizer's :func:`tokenizer_fingerprint`; raises or returns warnings."""
        return self._check("tokenizer", fingerprint)


def load_maps(path: str | os.PathLike[str], *, verify: bool = True) -> MapsFolder:
    """Open the maps folder at ``path``: parse and validate ``manifest.json``, check that every listed file
    exists and, with ``verify``, that its sha256 matches. Raises :class:`MapsError` naming the problem."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise MapsError(f"maps folder {path} does not exist" if not path.exists() else f"{path} is not a folder")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise MapsError(f"{path} is not a maps folder: it has no {MANIFEST}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MapsError(f"maps folder {path}: {MANIFEST} is not valid JSON ({exc})") from None
    validate_manifest(manifest, path)
    for name, expected in manifest["files"].items():
        if pathlib.PurePath(name).name != name or name in (".", ".."):
            raise MapsError(f"maps folder {path}: {MANIFEST} lists file {name!r} outside the folder")
        file = path / name
        if not file.is_file():
            raise MapsError(f"maps folder {path}: file {name} listed in {MANIFEST} is missing")
        if verify:
            actual = sha256_file(file)
            if actual != expected:
                raise MapsError(
                    f"maps folder {path}: {name} fails its sha256 check (manifest {expected[:12]}, file "
                    f"{actual[:12]}); the folder was changed after it was written"
                )
    return MapsFolder(path, manifest)
