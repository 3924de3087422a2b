"""The ridge maps, resident in the model's device memory, one stack per split.

Loaded once per scheduler process while the model loads, before SGLang sizes the KV pool, so the pool is
sized around them; ``resident_bytes`` is what they cost. With ``--ridgefill-map-dtype int8`` the maps
stay in their group-wise int8 layout (the map kernel dequantises inside the product), which halves their
memory against bf16; other dtypes hold dequantised maps. Whether the Triton map kernel or cuBLAS applies
them is measured once per map shape at construction (``kernels/choose.py``; the reference off CUDA). With
``residence="host"`` (``--ridgefill-map-residence host``) the maps stay in pinned host memory and each upper
layer's map is streamed to the device ahead of its use through ``slots`` device buffers (``map_stream.py``).
"""

from __future__ import annotations

import logging

import torch

from ..kernels.choose import fastest_map_backend
from ..kernels.map_apply import apply_map, apply_map_int8
from ..maps import MapsError
from ..vocabulary import MAP_RESIDENCES
from .map_stream import DEFAULT_SLOTS, StreamedMaps

logger = logging.getLogger(__name__)

RESIDENCES = MAP_RESIDENCES  # where the maps live (--ridgefill-map-residence)


class MapsStore:
    """Per split: ``A`` ``[n_upper, d_out, d_in]`` and ``b`` ``[n_upper, d_out]`` in the compute dtype, or
    with ``dtype=torch.int8`` the quantised ``q``, its float32 scales and a float32 ``b``. ``compute_dtype``:
    the dtype of the rows the maps are applied to (default: ``dtype``, bfloat16 for int8 maps)."""

    def __init__(
        self, folder, splits: list[int], *, dtype: torch.dtype, device: torch.device | str, hidden_size: int,
        kv_dim: int, compute_dtype: torch.dtype | None = None, residence: str = "device", slots: int = DEFAULT_SLOTS,
    ):
        if residence not in RESIDENCES:
            raise MapsError(f"map residence must be one of {', '.join(RESIDENCES)}, got {residence!r}")
        kind = folder.kind
        expected = (kind.d_in(hidden_size), kind.d_out(hidden_size, kv_dim))
        if (folder.d_in, folder.d_out) != expected:
            raise MapsError(
                f"maps folder {folder.path} holds {kind.name} maps of {folder.d_in} -> {folder.d_out} features, but "
                f"for the served model (hidden size {hidden_size}, K/V width {kv_dim}) they map {expected[0]} -> "
                f"{expected[1]}: the maps were fitted for another model"
            )
        self.folder = folder
        self.kind = kind
        self.dtype = dtype
        self._maps: dict[int, tuple] = {}
        for split in splits:
            if dtype == torch.int8:
                packed = folder.load_split_int8(split)
                if packed is None:
                    raise MapsError(
                        f"--ridgefill-map-dtype int8: split {split} of maps folder {folder.path} is stored in bf16, "
                        "not int8 (fit it with `sgl-ridgefill calibrate --quant int8`, or choose another map dtype)"
                    )
                q, scale, b, group_size = packed
                home = "cpu" if residence == "host" else device
                self._maps[split] = (q.to(home).contiguous(), scale.to(home).contiguous(), b.to(home), group_size)
            else:
                a, b = folder.load_split(split, dtype=dtype, device="cpu" if residence == "host" else device)
                self._maps[split] = (a.contiguous(), b.to(dtype).contiguous())
        self.residence = residence
        self._streams = {
            split: StreamedMaps([t for t in parts if torch.is_tensor(t)], device, slots)
            for split, parts in self._maps.items()
        } if residence == "host" else {}
        choices = {
            split: fastest_map_backend(
                dtype, folder.d_in, folder.d_out, device=device, x_dtype=compute_dtype,
                group_size=parts[3] if dtype == torch.int8 else None,
            )
            for split, parts in self._maps.items()
        }
        self._backends = {split: choice.backend for split, choice in choices.items()}
        for split, choice in choices.items():
            logger.info("RidgeFill split %d: %s", split, choice.describe())
        mixed = dtype not in (torch.int8, compute_dtype) and compute_dtype is not None
        if mixed and any(b in ("torch", "reference") for b in self._backends.values()):
            # apply_map: mixed dtypes have no single cuBLAS dtype, so the "torch" path is the float32 reference.
            logger.warning(
                "RidgeFill: %s maps with %s rows run through the float32 reference map (no fused kernel for the "
                "mix here), about an order of magnitude slower than maps in the rows' dtype; "
                "--ridgefill-map-dtype auto keeps them in the model's dtype",
                str(dtype).removeprefix("torch."), str(compute_dtype).removeprefix("torch."),
            )

    @property
    def splits(self) -> tuple[int, ...]:
        return tuple(sorted(self._maps))

    @property
    def maps_id(self) -> str:
        """What identifies these maps in cache namespaces: the manifest's id, else its file checksums."""
        manifest = getattr(self.folder, "manifest", {}) or {}
        return str(manifest.get("id") or manifest.get("files") or self.folder.path)

    @property
    def map_backends(self) -> dict[int, str]:
        """Per split, the map kernel measured fastest at construction."""
        return dict(self._backends)

    @map_backends.setter
    def map_backends(self, backends: dict[int, str]) -> None:
        """Use ``backends`` (another process's measurement, e.g. tensor-parallel rank 0's)."""
        assert set(backends) == set(self._backends), (backends, self._backends)
        self._backends = dict(backends)

    @property
    def resident_bytes(self) -> int:
        """Device memory the maps hold (with host residence: the streaming slots of each split)."""
        if self._streams:
            return sum(s.device_bytes for s in self._streams.values())
        return self.host_bytes

    @property
    def host_bytes(self) -> int:
        """The maps' whole size (where they live: the device, or host memory with host residence)."""
        return sum(t.numel() * t.element_size() for parts in self._maps.values() for t in parts if torch.is_tensor(t))

    def predict(self, split: int, layer_id: int, x_split: torch.Tensor) -> torch.Tensor:
        """``x̂_l = A_l x_S + b_l``; ``x_split``: ``[rows, d_in]`` -> ``[rows, d_out]`` in ``x_split``'s dtype."""
        parts = self._maps[split]
        j = layer_id - split
        backend = self._backends[split]  # measured at construction
        stream = self._streams.get(split)
        layer = stream.take(j) if stream is not None else tuple(t[j] for t in parts if torch.is_tensor(t))
        if self.dtype == torch.int8:
            q, scale, b = layer
            out = apply_map_int8(x_split, q, scale, b.to(x_split.dtype), parts[3], backend=backend)
        else:
            a, b = layer
            out = apply_map(x_split, a, b, backend=backend)
        if stream is not None:
            stream.done()
        return out
