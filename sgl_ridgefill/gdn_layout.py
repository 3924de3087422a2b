"""How the Gated DeltaNet (GDN) input projections are laid out in Qwen3.5 and Qwen3-Next checkpoints.

A GDN layer projects its normed input to ``q``, ``k`` (key heads), ``v``, ``z`` (value heads) and the gate
inputs ``b``, ``a`` (one per value head). Qwen3.5 stores them as contiguous blocks (Hugging Face:
``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``; SGLang fuses them to ``in_proj_qkvz`` ``[q|k|v|z]``
and ``in_proj_ba`` ``[b|a]``). Qwen3-Next stores ``in_proj_qkvz`` and ``in_proj_ba`` interleaved per key head
``g``: ``[q_g | k_g | v_g | z_g]`` and ``[b_g | a_g]``, ``v_g``, ``z_g``, ``b_g``, ``a_g`` covering the ``HV / Hk``
value heads of that key head. Both SGLang and Hugging Face keep the checkpoint's layout, so the same row
indices serve both. Nothing here imports SGLang.
"""

from __future__ import annotations

from typing import Any

import torch


def gdn_rows(num_k_heads: int, num_v_heads: int, head_k: int, head_v: int, interleaved: bool):
    """Row indices ``(qkv, z, ba)``: into ``in_proj_qkvz`` giving ``[q | k | v]`` (key heads in order, then value
    heads in order) and ``z``; into ``in_proj_ba`` giving ``[b | a]``."""
    r = num_v_heads // num_k_heads
    if not interleaved:
        key, value = num_k_heads * head_k, num_v_heads * head_v
        return (torch.arange(2 * key + value), torch.arange(2 * key + value, 2 * key + 2 * value),
                torch.arange(2 * num_v_heads))
    starts = torch.arange(num_k_heads) * (2 * head_k + 2 * r * head_v)

    def rows(offset: int, width: int) -> torch.Tensor:
        return (starts[:, None] + offset + torch.arange(width)[None]).reshape(-1)

    qkv = torch.cat([rows(0, head_k), rows(head_k, head_k), rows(2 * head_k, r * head_v)])
    z = rows(2 * head_k + r * head_v, r * head_v)
    b = (torch.arange(num_k_heads)[:, None] * 2 * r + torch.arange(r)[None]).reshape(-1)
    return qkv, z, torch.cat([b, b + r])


def hf_qkv_weight(mixer: Any) -> torch.Tensor:
    """The ``[q | k | v]`` rows of a Hugging Face GDN mixer's input projection (``[conv_dim, d]``)."""
    if hasattr(mixer, "in_proj_qkv"):  # Qwen3.5
        return mixer.in_proj_qkv.weight
    qkv, _, _ = gdn_rows(mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim, True)
    return mixer.in_proj_qkvz.weight[qkv]


def hf_projections(mixer: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mixed_qkv [rows, conv_dim]``, ``z [rows, HV * V]``, ``b``, ``a`` ``[rows, HV]`` of a Hugging Face GDN mixer
    (Qwen3.5 or Qwen3-Next) for normed inputs ``h`` ``[rows, d]``."""
    if hasattr(mixer, "in_proj_qkv"):
        return mixer.in_proj_qkv(h), mixer.in_proj_z(h), mixer.in_proj_b(h), mixer.in_proj_a(h)
    qkv, z, ba = gdn_rows(mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim, True)
    qkvz, ba_out = mixer.in_proj_qkvz(h), mixer.in_proj_ba(h)
    heads = mixer.num_v_heads
    return qkvz[:, qkv], qkvz[:, z], ba_out[:, ba[:heads]], ba_out[:, ba[heads:]]
