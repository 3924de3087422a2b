"""The passes one RidgeFill chunk is made of, over sub-batches (``subbatch.py``) of SGLang's batch.

- ``lower_pass``: layers ``0..S-1`` exactly for a contiguous run of rows; returns ``x_S``.
- ``fill_pass``: for every upper layer, K and V from the map's prediction, written into the KV pool; no
  query, attention output or MLP runs.
- ``upper_pass``: layers ``S..L-1`` exactly for chosen rows (exact rows and the tail) over the request's
  cache, layer by layer, so per-layer corrections (value rescale) see every row's exact input.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.model_executor.forward_context import get_attn_backend

from .attention_scope import AttentionScope, attention_scope

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .adapter import ModelAdapter
    from .maps_store import MapsStore

# (layer id, first row, last row + 1, sink) : capture the queries of rows [lo, hi) of a pass at a layer.
QueryCapture = tuple[int, int, int, list]


def lower_pass(ad: ModelAdapter, sub: ForwardBatch, split: int, captures: list[QueryCapture] = ()) -> torch.Tensor:
    """Layers ``0..split-1`` for the rows of ``sub``; returns ``x_S``: ``[rows, hidden]``."""
    handles = []
    for layer_id, lo, hi, sink in captures:

        def grab(module, args, kwargs, lo=lo, hi=hi, sink=sink):
            q = args[0] if args else kwargs["q"]
            sink.append(q[lo:hi].detach().clone())

        handles.append(ad.layers[layer_id].self_attn.attn.register_forward_pre_hook(grab, with_kwargs=True))
    get_attn_backend().init_forward_metadata(sub)
    try:
        hs = ad.embed(sub.input_ids)
        residual_batch.start(sub)
        for i in range(split):
            hs = ad.layers[i](sub.positions, hs, sub)
        return residual_batch.fold(hs, sub)
    finally:
        residual_batch.clear(sub)
        for h in handles:
            h.remove()


def fill_pass(
    ad: ModelAdapter,
    maps: MapsStore | None,
    split: int,
    x_split: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    *,
    physical: bool,
) -> None:
    """Write every upper layer's K/V for filled rows. ``maps=None`` is the identity fill (``x̂_l = x_S``).

    ``x_split``: ``[rows, hidden]``; ``positions``, ``slots``: ``[rows]``.
    """
    pool = get_attn_backend().token_to_kv_pool
    loc = KVWriteLoc(slots, None, physical=physical)
    for layer_id in range(split, ad.shape.num_layers):
        x_hat = x_split if maps is None else maps.predict(split, layer_id, x_split)
        k, v = ad.key_value(layer_id, positions, x_hat)
        pool.set_kv_buffer(ad.layers[layer_id].self_attn.attn, loc, k, v)


LayerCallback = Callable[[int, torch.Tensor], None]


def upper_pass(
    ad: ModelAdapter,
    sub: ForwardBatch,
    split: int,
    x_split: torch.Tensor,
    *,
    visible_keys: torch.Tensor | None = None,
    before_layer: LayerCallback | None = None,
    captures: list[QueryCapture] = (),
    final_norm: bool = True,
) -> torch.Tensor:
    """Layers ``split..L-1`` for the rows of ``sub`` starting from their split states ``x_split``.

    ``before_layer(layer_id, x_l)`` sees every row's exact layer input (``[rows, hidden]``) before the layer
    runs. Returns the final-normed hidden states ``[rows, hidden]`` (or the last residual stream).
    """
    handles = []
    for layer_id, lo, hi, sink in captures:

        def grab(module, args, kwargs, lo=lo, hi=hi, sink=sink):
            q = args[0] if args else kwargs["q"]
            sink.append(q[lo:hi].detach().clone())

        handles.append(ad.layers[layer_id].self_attn.attn.register_forward_pre_hook(grab, with_kwargs=True))
    get_attn_backend().init_forward_metadata(sub)
    try:
        with attention_scope(AttentionScope(visible_keys=visible_keys)):
            hs = residual_batch.set_written(x_split, sub)
            for layer_id in range(split, ad.shape.num_layers):
                if before_layer is not None:
                    hs = residual_batch.fold(hs, sub)
                    before_layer(layer_id, hs)
                hs = ad.layers[layer_id](sub.positions, hs, sub)
            if final_norm:
                return residual_batch.final_norm(hs, sub, ad.model.norm)
            return residual_batch.fold(hs, sub)
    finally:
        residual_batch.clear(sub)
        for h in handles:
            h.remove()
