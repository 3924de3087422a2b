"""Attention received by every key row from a few query rows, summed over queries and heads.

The selectors rank prefix rows by how much attention the last ``q`` prompt rows give them (the
reference attention selection). For queries ``q: [n_q, n_q_heads, head_dim]`` and keys
``k: [n_k, n_kv_heads, head_dim]`` (both after RoPE), with grouped-query attention (query head ``h``
reads kv head ``h // (n_q_heads // n_kv_heads)``) and a causal mask by position (query ``i`` sees key
``j`` iff ``k_positions[j] <= q_positions[i]``), the result is ``[n_k]`` float32::

    received[j] = sum over i, h of softmax_j(scale * q[i, h] · k[j, kv(h)])   (over the keys i sees)

The full ``[n_q, heads, n_k]`` matrix is built only when it fits the memory bound: keys are processed in
blocks, in two passes (the log-sum-exp of every (query, head), then the probabilities summed per key), so
memory is ``O(n_q · heads · block)``. The PyTorch reference, which runs on the CPU, takes one pass over blocks
of queries instead when a query's whole row of scores fits that bound, computing each score once (and holding
the keys in float32 besides). Every row of a query's softmax sums to 1, so ``received.sum()`` equals the
number of (query, head) pairs that see at least one key.
"""

from __future__ import annotations

import math

import torch

from sgl_ridgefill.kernels.backend import check_same_device, dot_in_fp32, interpreter_active, use_triton

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# On the host the reference's one pass takes as many queries at a time as keep their scores (about 16 MiB of
# float32) in the CPU's caches from the GEMM to the softmax; blocks of a few hundred queries ran up to twice
# slower.
_HOST_BLOCK_SCORES = 1 << 22


def _check(
    where: str,
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float,
) -> None:
    if q.dim() != 3:
        raise ValueError(f"{where}: q must be [n_q, n_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k.dim() != 3:
        raise ValueError(f"{where}: k must be [n_k, n_kv_heads, head_dim], got shape {tuple(k.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{where}: q has head_dim {q.shape[2]} but k has {k.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"{where}: n_q_heads={q.shape[1]} must be a multiple of n_kv_heads={k.shape[1]} (grouped-query attention)"
        )
    for name, t in (("q", q), ("k", k)):
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{where}: {name} must be bf16, fp16 or fp32, got {t.dtype}")
    for name, pos, n in (("q_positions", q_positions, q.shape[0]), ("k_positions", k_positions, k.shape[0])):
        if tuple(pos.shape) != (n,):
            raise ValueError(f"{where}: {name} must have shape ({n},), got {tuple(pos.shape)}")
        if pos.dtype.is_floating_point or pos.dtype == torch.bool or pos.is_complex():
            raise ValueError(f"{where}: {name} must hold integer positions, got {pos.dtype}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"{where}: scale must be a positive finite number, got {scale!r}")
    check_same_device(where, q=q, k=k, q_positions=q_positions, k_positions=k_positions)


def attention_received_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float,
    *,
    block: int = 1024,
) -> torch.Tensor:
    """``q: [n_q, n_q_heads, head_dim]``, ``k: [n_k, n_kv_heads, head_dim]``, ``q_positions: [n_q]``,
    ``k_positions: [n_k]`` -> ``[n_k]`` float32: attention each key receives, summed over queries and heads.

    Computed in float32 with scores of at most ``n_q * n_q_heads * block`` floats at a time: in one pass over
    blocks of queries when every key of one query fits that bound (each score computed once, its softmax over
    the query's whole row; the keys are held in float32 besides), else in two passes over blocks of ``block``
    keys.
    """
    where = "attention_received_reference"
    _check(where, q, k, q_positions, k_positions, scale)
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"{where}: block must be a positive integer, got {block!r}")
    n_q, n_heads, head_dim = q.shape
    n_k, n_kv = k.shape[:2]
    if n_q == 0:
        return torch.zeros(n_k, dtype=torch.float32, device=q.device)
    group = n_heads // n_kv
    # [n_kv, n_q * group, head_dim]: query head h = kv * group + j reads kv head h // group, so each kv
    # head is one batched GEMM against its keys.
    qf = (q.float() * scale).reshape(n_q, n_kv, group, head_dim).permute(1, 0, 2, 3).reshape(n_kv, -1, head_dim)
    q_pos = q_positions.long()
    # On the host, a block of keys every query sees (the prefix, for the tail's queries) needs no mask: reading
    # the positions there costs nothing, while masking costs a pass over the block's scores.
    first_query = int(q_pos.min()) if q_pos.device.type == "cpu" and k_positions.device.type == "cpu" and n_q else None
    rows_per_block = (n_q * n_heads * block) // max(n_heads * n_k, 1)
    if first_query is not None:
        rows_per_block = min(rows_per_block, max(1, _HOST_BLOCK_SCORES // max(n_heads * n_k, 1)))
    if n_k and rows_per_block >= 1:
        return _received_by_query_blocks(qf.view(n_kv, n_q, group, head_dim), k, q_pos, k_positions.long(),
                                          rows_per_block, on_host=first_query is not None)

    def masked_scores(start: int) -> torch.Tensor:
        """``[n_kv, n_q, group, blk]`` scores against keys ``start:start+block``; -inf where not visible."""
        kf = k[start : start + block].float().permute(1, 2, 0)  # [n_kv, head_dim, blk]
        s = torch.matmul(qf, kf).view(n_kv, n_q, group, -1)
        keys = k_positions[start : start + block].long()
        if first_query is not None and int(keys.max()) <= first_query:
            return s
        hidden = keys[None, :] > q_pos[:, None]  # [n_q, blk]
        return s.masked_fill_(hidden[None, :, None, :], float("-inf"))

    # Pass 1: online log-sum-exp per (kv head, query, head in group).
    m = torch.full((n_kv, n_q, group), float("-inf"), device=q.device)
    denom = torch.zeros((n_kv, n_q, group), device=q.device)
    for start in range(0, n_k, block):
        s = masked_scores(start)
        m_new = torch.maximum(m, s.amax(dim=-1))
        # Until a (query, head) has seen a key its max is -inf; shift by 0 then so exp() stays defined.
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        denom = denom * torch.exp(m - shift) + s.sub_(shift[..., None]).exp_().sum(dim=-1)
        m = m_new
    # +inf for a (query, head) that sees no key: all of its probabilities become exp(-inf) = 0.
    lse = torch.where(denom > 0, m + torch.log(denom), torch.full_like(denom, float("inf")))

    # Pass 2: probabilities summed over queries and heads, per key.
    received = torch.empty(n_k, dtype=torch.float32, device=q.device)
    for start in range(0, n_k, block):
        p = masked_scores(start).sub_(lse[..., None]).exp_()
        received[start : start + block] = p.sum(dim=(0, 1, 2))
    return received


def _received_by_query_blocks(qf: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                              rows: int, *, on_host: bool) -> torch.Tensor:
    """The reference's one pass: ``qf`` ``[n_kv, n_q, group, d]`` (scaled float32), ``rows`` queries at a time
    against every key (``[n_kv, rows, group, n_k]`` scores, each query's softmax whole). On the host only the key
    columns some query of the block cannot see are masked (for the tail's queries, the tail's own keys)."""
    n_kv, n_q, group, head_dim = qf.shape
    n_k = k.shape[0]
    # Contiguous keys: a GEMM against a permuted view of them runs at about half the speed on the CPU.
    kf = k.float().permute(1, 2, 0).contiguous()  # [n_kv, head_dim, n_k]
    # A query that sees no key adds nothing: its scores stay unmasked (a finite softmax) and its weight is 0.
    sees = (k_pos.min() <= q_pos).to(torch.float32)  # [n_q]
    received = torch.zeros(1, n_k, dtype=torch.float32, device=qf.device)
    for start in range(0, n_q, rows):
        block = qf[:, start : start + rows]
        nb = block.shape[1]
        s = torch.matmul(block.reshape(n_kv, nb * group, head_dim), kf).view(n_kv, nb, group, n_k)
        hidden = (k_pos[None, :] > q_pos[start : start + nb, None]) & (sees[start : start + nb, None] > 0)
        first = 0
        if on_host:
            cols = torch.nonzero(hidden.any(dim=0)).flatten()
            first = int(cols[0]) if cols.numel() else n_k
        if first < n_k:
            s[..., first:].masked_fill_(hidden[None, :, None, first:], float("-inf"))
        p = torch.softmax(s.view(-1, n_k), dim=-1)
        weight = sees[start : start + nb].view(1, nb, 1).expand(n_kv, nb, group).reshape(1, -1)
        received += torch.matmul(weight, p)  # the column sums as one GEMV, over the queries that see a key
    return received.view(n_k)


def attention_received(
    q: torch.Tensor,
    k: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    scale: float,
    *,
    backend: str = "auto",
    block: int = 1024,
) -> torch.Tensor:
    """Same contract as :func:`attention_received_reference`; Triton on CUDA tensors or ``backend="triton"``.

    ``block`` only applies to the reference; the kernels pick their own tiles.
    """
    where = "attention_received"
    _check(where, q, k, q_positions, k_positions, scale)
    if not use_triton(backend, q, k, q_positions, k_positions, where=where):
        return attention_received_reference(q, k, q_positions, k_positions, scale, block=block)
    return _launch(q, k, q_positions, k_positions, float(scale))


def _launch(
    q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """Run both passes. Shapes as in :func:`attention_received_reference`; any strides are accepted."""
    import triton

    from sgl_ridgefill.kernels import attention_stats_triton as kernels

    n_q, n_heads, head_dim = q.shape
    n_k, n_kv = k.shape[:2]
    assert n_heads % n_kv == 0 and k.shape[2] == head_dim, f"q {tuple(q.shape)} vs k {tuple(k.shape)}"
    assert all(s >= 0 for t in (q, k, q_positions, k_positions) for s in t.stride()), "negative strides"
    partial = torch.zeros(n_kv, n_k, dtype=torch.float32, device=q.device)
    if n_q == 0 or n_k == 0:
        return partial.sum(dim=0)
    lse = torch.empty(n_q, n_heads, dtype=torch.float32, device=q.device)
    if interpreter_active():
        tiles = dict(BLOCK_Q=16, BLOCK_K=32)
    else:
        tiles = dict(BLOCK_Q=64, BLOCK_K=64, num_warps=4, num_stages=2)
    common = dict(
        n_q=n_q, n_k=n_k, head_dim=head_dim, group=n_heads // n_kv,
        qk_scale=scale * math.log2(math.e),
        stride_qm=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2),
        stride_km=k.stride(0), stride_kh=k.stride(1), stride_kd=k.stride(2),
        stride_qpos=q_positions.stride(0), stride_kpos=k_positions.stride(0),
        stride_lm=lse.stride(0), stride_lh=lse.stride(1),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), DOT_FP32=dot_in_fp32(q.dtype, k.dtype), **tiles,
    )
    kernels._lse_kernel[(triton.cdiv(n_q, tiles["BLOCK_Q"]), n_heads)](q, k, q_positions, k_positions, lse, **common)
    kernels._received_kernel[(triton.cdiv(n_k, tiles["BLOCK_K"]), n_kv)](
        q, k, q_positions, k_positions, lse, partial,
        stride_ph=partial.stride(0), stride_pk=partial.stride(1), **common,
    )
    return partial.sum(dim=0)
