"""The one place RidgeFill writes SGLang's KV pool (attention layers write their own rows themselves).

Every write goes through the pool's ``set_kv_buffer`` with a ``KVWriteLoc``, as SGLang's attention
backends write, so a pool with its own layout (scales, SWA translation) sees the same calls.
"""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ..kernels.rescale import apply_value_scale_


def write_kv(pool, attn, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, physical: bool) -> None:
    """Write K/V of ``attn`` (a ``RadixAttention``) for the rows at pool ``slots``.

    ``slots``: ``[rows]``; ``k``, ``v``: ``[rows, kv_heads, head_dim]``.
    """
    pool.set_kv_buffer(attn, KVWriteLoc(slots, None, physical=physical), k.contiguous(), v.contiguous())


def read_kv(pool, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of layer ``layer_id`` at pool ``slots``: ``[rows, kv_heads, head_dim]`` each."""
    return pool.get_key_buffer(layer_id)[slots], pool.get_value_buffer(layer_id)[slots]


def scale_values(pool, attn, slots: torch.Tensor, scale: torch.Tensor, *, physical: bool) -> None:
    """Multiply the values of ``attn``'s layer at ``slots`` by a per-KV-head ``scale`` (``[kv_heads]``); keys stay."""
    if not slots.numel():
        return
    k, v = read_kv(pool, attn.layer_id, slots)  # copies (advanced indexing)
    write_kv(pool, attn, slots, k, apply_value_scale_(v, scale), physical=physical)
