"""The fill: K and V of filled rows in every upper layer, from their split states, for each arm and map kind.

- ``identity`` arm: every upper layer's input is ``x_S`` itself (POP's fill);
- ``ridgefill`` arm, by the maps' kind (``maps/kinds.py``): ``residual`` and ``normalised`` predict the
  layer's input ``x̂_l = A_l z + b_l`` and run it through the layer's own norm, K/V projection, K norm and
  RoPE; ``kv`` and ``kv+context`` predict the layer's K (before its K norm and RoPE) and V directly.

Every upper layer, layer ``S`` included, applies its map as the maps folder holds it (calibration fits layer
``S``'s exactly: the identity for ``residual``). A ``kv+context`` fill reads each row's predecessor and a
running mean, carried across chunks in a :class:`~sgl_ridgefill.maps.kinds.ContextState` on the request's
state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..maps.kinds import ContextState, MapKind, features

if TYPE_CHECKING:
    from .adapter import ModelAdapter
    from .maps_store import MapsStore


class Fill:
    """The fill of one request's filled rows: ``maps=None`` is the identity arm."""

    def __init__(self, adapter: ModelAdapter, maps: MapsStore | None, split: int):
        self.adapter = adapter
        self.maps = maps
        self.split = split
        self.kind: MapKind | None = maps.kind if maps is not None else None

    @classmethod
    def of_plan(cls, adapter: ModelAdapter, maps: MapsStore | None, plan) -> Fill:
        """The fill a request's plan runs: its arm's (the maps for ``ridgefill``, the identity otherwise) at
        its split."""
        return cls(adapter, maps if plan.arm == "ridgefill" else None, plan.split)

    def features(self, x_split: torch.Tensor, state: ContextState | None = None) -> tuple[torch.Tensor, ContextState | None]:
        """The maps' features of consecutive rows (``[rows, d_in]``, in ``x_split``'s dtype) and the context
        after them."""
        if self.kind is None:
            return x_split, None
        z, state = features(self.kind, x_split, state)
        return z.to(x_split.dtype), state

    def key_value(
        self, layer_id: int, positions: torch.Tensor, x_split: torch.Tensor, z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (after K norm and RoPE) and V of ``layer_id`` for filled rows: ``[rows, kv_heads, head_dim]``.

        ``x_split``: ``[rows, d]`` split states; ``z``: their features (``self.features``); ``positions``:
        ``[rows]``."""
        ad = self.adapter
        if self.maps is None:
            return ad.key_value(layer_id, positions, x_split)
        y = self.maps.predict(self.split, layer_id, z)
        return self.kind.key_value(ad, layer_id, positions, y.to(x_split.dtype))

    def value(self, layer_id: int, x_split: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """V alone (the value rescale compares it with the exact V): ``[rows, kv_heads, head_dim]``."""
        ad = self.adapter
        if self.maps is None:
            return ad.value(layer_id, x_split)
        y = self.maps.predict(self.split, layer_id, z).to(x_split.dtype)
        return self.kind.value(ad, layer_id, y)
