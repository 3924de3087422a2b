"""The ridge maps, resident in the model's device memory, one stack per split.

Loaded once per scheduler process while the model loads, before SGLang sizes the KV pool, so the pool is
sized around them; ``resident_bytes`` is what they cost.
"""

from __future__ import annotations

import logging

import torch

from ..kernels.map_apply import apply_map

logger = logging.getLogger(__name__)


class MapsStore:
    """``A``: ``[n_upper, d_out, d_in]``, ``b``: ``[n_upper, d_out]`` per split, in the compute dtype."""

    def __init__(self, folder, splits: list[int], *, dtype: torch.dtype, device: torch.device | str):
        self.folder = folder
        self.dtype = dtype
        self._maps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for split in splits:
            a, b = folder.load_split(split, dtype=dtype, device=device)
            self._maps[split] = (a.contiguous(), b.to(dtype).contiguous())

    @property
    def splits(self) -> tuple[int, ...]:
        return tuple(sorted(self._maps))

    @property
    def resident_bytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self._maps.values())

    def predict(self, split: int, layer_id: int, x_split: torch.Tensor) -> torch.Tensor:
        """``x̂_l = A_l x_S + b_l``; ``x_split``: ``[rows, d_in]`` -> ``[rows, d_out]`` in ``x_split``'s dtype."""
        a, b = self._maps[split]
        j = layer_id - split
        # Triton kernel on CUDA, the PyTorch reference (float32 accumulation) elsewhere.
        return apply_map(x_split, a[j], b[j])
