"""The ridge maps, resident in the model's device memory, one stack per split.

Loaded once per scheduler process while the model loads, before SGLang sizes the KV pool, so the pool is
sized around them; ``resident_bytes`` is what they cost. With ``--ridgefill-map-dtype int8`` the maps
stay in their group-wise int8 layout (the map kernel dequantises inside the product), which halves their
memory against bf16; other dtypes hold dequantised maps. Whether the Triton map kernel or cuBLAS applies
them is measured once per map shape at construction (``kernels/choose.py``; the reference off CUDA).
"""

from __future__ import annotations

import logging

import torch

from ..kernels.choose import fastest_map_backend
from ..kernels.map_apply import apply_map, apply_map_int8
from ..maps import MapsError

logger = logging.getLogger(__name__)


class MapsStore:
    """Per split: ``A`` ``[n_upper, d_out, d_in]`` and ``b`` ``[n_upper, d_out]`` in the compute dtype, or
    with ``dtype=torch.int8`` the quantised ``q``, its float32 scales and a float32 ``b``. ``compute_dtype``:
    the dtype of the rows the maps are applied to (default: ``dtype``, bfloat16 for int8 maps)."""

    def __init__(
        self, folder, splits: list[int], *, dtype: torch.dtype, device: torch.device | str, hidden_size: int,
        kv_dim: int, compute_dtype: torch.dtype | None = None,
    ):
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
                self._maps[split] = (q.to(device).contiguous(), scale.to(device).contiguous(), b.to(device), group_size)
            else:
                a, b = folder.load_split(split, dtype=dtype, device=device)
                self._maps[split] = (a.contiguous(), b.to(dtype).contiguous())
        self._backends = {
            split: fastest_map_backend(
                dtype, folder.d_in, folder.d_out, device=device, x_dtype=compute_dtype,
                group_size=parts[3] if dtype == torch.int8 else None,
            ).backend
            for split, parts in self._maps.items()
        }

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
        return sum(t.numel() * t.element_size() for parts in self._maps.values() for t in parts if torch.is_tensor(t))

    def predict(self, split: int, layer_id: int, x_split: torch.Tensor) -> torch.Tensor:
        """``x̂_l = A_l x_S + b_l``; ``x_split``: ``[rows, d_in]`` -> ``[rows, d_out]`` in ``x_split``'s dtype."""
        parts = self._maps[split]
        j = layer_id - split
        backend = self._backends[split]  # measured at construction
        if self.dtype == torch.int8:
            q, scale, b, group_size = parts
            return apply_map_int8(x_split, q[j], scale[j], b[j].to(x_split.dtype), group_size, backend=backend)
        a, b = parts
        return apply_map(x_split, a[j], b[j], backend=backend)
