"""Triton kernels for the attention each key row receives (see :mod:`sgl_ridgefill.kernels.attention_stats`).

This module imports ``triton`` at the top: load it only through the launcher in
:mod:`sgl_ridgefill.kernels.attention_stats`, which checks shapes, strides and dtypes.

Two passes, as in the reference's key-blocked path, so no ``[n_q, heads, n_k]`` matrix ever exists:

1. ``_lse_kernel``: one program per (query tile, query head) streams every key tile and keeps an online
   log-sum-exp, written as ``lse: [n_q, n_q_heads]`` (base 2, in units of ``scale * log2(e) * q·k``).
2. ``_received_kernel``: one program per (key tile, kv head) recomputes the scores of every query and
   every query head of that kv group against its key tile, turns them into probabilities with ``lse``,
   and sums them over queries and heads into ``partial: [n_kv_heads, n_k]``. Each program owns its
   output slice, so there are no atomics and the result is deterministic.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scores(q, k, qk_scale, DOT_FP32: tl.constexpr):
    """``q: [BQ, BD]``, ``k: [BK, BD]`` -> ``[BQ, BK]`` float32 scores in base-2 logit units."""
    if DOT_FP32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s * qk_scale


@triton.jit
def _lse_kernel(
    q_ptr, k_ptr, qpos_ptr, kpos_ptr, lse_ptr,
    n_q, n_k, head_dim, group, qk_scale,
    stride_qm, stride_qh, stride_qd,
    stride_km, stride_kh, stride_kd,
    stride_qpos, stride_kpos,
    stride_lm, stride_lh,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
):
    head = tl.program_id(1)
    kv_head = head // group
    offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = offs_q < n_q
    d_ok = offs_d < head_dim
    q = tl.load(
        q_ptr + offs_q[:, None].to(tl.int64) * stride_qm + head * stride_qh + offs_d[None, :] * stride_qd,
        mask=q_ok[:, None] & d_ok[None, :], other=0,
    )
    q_pos = tl.load(qpos_ptr + offs_q * stride_qpos, mask=q_ok, other=0)

    # A finite floor instead of -inf keeps exp2(m_old - m_new) defined before any key is visible.
    m = tl.full((BLOCK_Q,), -1.0e30, dtype=tl.float32)
    denom = tl.zeros((BLOCK_Q,), dtype=tl.float32)
    for k0 in range(0, n_k, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < n_k
        k = tl.load(
            k_ptr + offs_k[:, None].to(tl.int64) * stride_km + kv_head * stride_kh + offs_d[None, :] * stride_kd,
            mask=k_ok[:, None] & d_ok[None, :], other=0,
        )
        k_pos = tl.load(kpos_ptr + offs_k * stride_kpos, mask=k_ok, other=0)
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :] & q_ok[:, None]
        s = tl.where(visible, _scores(q, k, qk_scale, DOT_FP32), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        denom = denom * tl.exp2(m - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), axis=1)
        m = m_new
    # A query that sees no key gets +inf, so pass 2 turns every one of its scores into probability 0
    # (the maximum only keeps log2 away from 0 in the branch tl.where discards).
    lse = tl.where(denom > 0, m + tl.log2(tl.maximum(denom, 1e-30)), float("inf"))
    tl.store(lse_ptr + offs_q * stride_lm + head * stride_lh, lse, mask=q_ok)


@triton.jit
def _received_kernel(
    q_ptr, k_ptr, qpos_ptr, kpos_ptr, lse_ptr, partial_ptr,
    n_q, n_k, head_dim, group, qk_scale,
    stride_qm, stride_qh, stride_qd,
    stride_km, stride_kh, stride_kd,
    stride_qpos, stride_kpos,
    stride_lm, stride_lh,
    stride_ph, stride_pk,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
):
    kv_head = tl.program_id(1)
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    k_ok = offs_k < n_k
    d_ok = offs_d < head_dim
    k = tl.load(
        k_ptr + offs_k[:, None].to(tl.int64) * stride_km + kv_head * stride_kh + offs_d[None, :] * stride_kd,
        mask=k_ok[:, None] & d_ok[None, :], other=0,
    )
    k_pos = tl.load(kpos_ptr + offs_k * stride_kpos, mask=k_ok, other=0)

    received = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for j in range(0, group):
        head = kv_head * group + j
        for q0 in range(0, n_q, BLOCK_Q):
            offs_q = q0 + tl.arange(0, BLOCK_Q)
            q_ok = offs_q < n_q
            q = tl.load(
                q_ptr + offs_q[:, None].to(tl.int64) * stride_qm + head * stride_qh + offs_d[None, :] * stride_qd,
                mask=q_ok[:, None] & d_ok[None, :], other=0,
            )
            q_pos = tl.load(qpos_ptr + offs_q * stride_qpos, mask=q_ok, other=0)
            lse = tl.load(lse_ptr + offs_q * stride_lm + head * stride_lh, mask=q_ok, other=float("inf"))
            visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :] & q_ok[:, None]
            p = tl.exp2(_scores(q, k, qk_scale, DOT_FP32) - lse[:, None])
            received += tl.sum(tl.where(visible, p, 0.0), axis=0)
    tl.store(partial_ptr + kv_head * stride_ph + offs_k * stride_pk, received, mask=k_ok)
