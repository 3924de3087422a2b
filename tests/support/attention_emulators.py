"""PyTorch emulators of the attention calls RidgeFill's planner feeds, and the reference they must match.

Each emulator follows one kernel's contract literally (which keys it reads, which mask it applies, when the
pool is written), one request at a time, so a plan that is wrong for a backend is wrong here too. Shapes:
``q`` [rows, q_heads, d]; a token pool ``k_pool`` [slots, kv_heads, d], ``v_pool`` [slots, kv_heads, dv];
``q_heads = kv_heads * group`` (GQA). Rows with no admitted key give 0, as the Triton kernels do.
"""

from __future__ import annotations

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [m, hq, d]; k: [t, hk, d]; v: [t, hk, dv]; allowed: [m, t] bool -> [m, hq, dv]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,thd->hmt", q, k) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: all -inf -> nan -> 0
    return torch.einsum("hmt,thd->mhd", weights, v)


def reference_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    q_positions: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Direct masked softmax: the query at position ``p`` attends to ``{k <= p : visible[k]}``.

    slots: [seq_len] pool slot of each position; q_positions: [n]; visible: [seq_len] bool or None.
    Computed in float64, returned in ``q``'s dtype: [n, q_heads, dv].
    """
    seq_len = slots.numel()
    keys = torch.arange(seq_len)
    allowed = keys[None, :] <= q_positions[:, None]
    if visible is not None:
        allowed &= visible[None, :seq_len]
    out = _attend(q.double(), k_pool[slots].double(), v_pool[slots].double(), allowed, scale)
    return out.to(q.dtype)


def triton_extend_emulator(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    scale: float,
    *,
    is_causal: bool = True,
    skip_prefix_custom_mask: bool = True,
    skip_extend: bool = False,
) -> torch.Tensor:
    """SGLang's Triton ``extend_attention_fwd`` (``sglang/kernels/ops/attention/extend_attention.py``).

    Per request ``b``: stage 1 attends the prefix ``k_buffer[kv_indices[kv_indptr[b]:kv_indptr[b+1]]]``,
    unmasked unless a custom mask is given and ``skip_prefix_custom_mask`` is False; stage 2 attends the
    request's own ``k_extend`` rows, causally by index or by the custom mask, and is dropped by
    ``skip_extend``. The custom mask is row-major ``[qo_len, prefix_len + qo_len]`` at ``mask_indptr[b]``.
    """
    out = q.new_zeros(q.shape[0], q.shape[1], v_buffer.shape[-1])
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        m, prefix = q1 - q0, k1 - k0
        index = kv_indices[k0:k1].long()
        mask = None
        if custom_mask is not None:
            start = int(mask_indptr[b])
            mask = custom_mask[start : start + m * (prefix + m)].view(m, prefix + m) != 0
        prefix_allowed = torch.ones(m, prefix, dtype=torch.bool)
        if mask is not None and not skip_prefix_custom_mask:
            prefix_allowed = mask[:, :prefix]
        if mask is not None:
            extend_allowed = mask[:, prefix:]
        elif is_causal:
            extend_allowed = torch.ones(m, m, dtype=torch.bool).tril()
        else:
            extend_allowed = torch.ones(m, m, dtype=torch.bool)
        if skip_extend:
            extend_allowed = torch.zeros(m, m, dtype=torch.bool)
        k = torch.cat([k_buffer[index], k_extend[q0:q1]])
        v = torch.cat([v_buffer[index], v_extend[q0:q1]])
        out[q0:q1] = _attend(q[q0:q1], k, v, torch.cat([prefix_allowed, extend_allowed], dim=1), scale)
    return out


def flashinfer_paged_emulator(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    custom_mask: torch.Tensor | None,
    scale: float,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """FlashInfer's paged prefill at page size 1, K/V already in the pool (SGLang's paged path).

    ``causal`` is bottom-right aligned: row ``i`` of a request keeps key index ``<= i + kv_len - qo_len``
    (``flashinfer/data/include/flashinfer/attention/prefill.cuh:1675``); ``kv_len < qo_len`` with causal is
    an error there. A planned custom mask (row-major ``[qo_len, kv_len]`` per request, concatenated) replaces
    the causal mask.
    """
    assert bool((kv_last_page_len == 1).all()), "page size 1: every last page holds one token"
    out = q.new_zeros(q.shape[0], q.shape[1], v_pool.shape[-1])
    mask_start = 0
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        m, n = q1 - q0, k1 - k0
        if custom_mask is not None:
            allowed = custom_mask[mask_start : mask_start + m * n].view(m, n).bool()
            mask_start += m * n
        elif causal:
            assert n >= m, f"FlashInfer rejects causal with kv_len {n} < qo_len {m}"
            allowed = torch.ones(m, n, dtype=torch.bool).tril(diagonal=n - m)
        else:
            allowed = torch.ones(m, n, dtype=torch.bool)
        index = kv_indices[k0:k1].long()
        out[q0:q1] = _attend(q[q0:q1], k_pool[index], v_pool[index], allowed, scale)
    return out


def fa3_kvcache_emulator(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    scale: float,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """``flash_attn_with_kvcache`` with a page table, as SGLang's fa3 backend calls it.

    k_cache / v_cache: [num_pages, page_size, kv_heads, d]; key ``c`` of request ``b`` is token
    ``c % page_size`` of page ``page_table[b, c // page_size]``, for ``c < cache_seqlens[b]``; ``causal`` is
    bottom-right aligned as in FlashInfer.
    """
    page_size = k_cache.shape[1]
    out = q.new_zeros(q.shape[0], q.shape[1], v_cache.shape[-1])
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        m, n = q1 - q0, int(cache_seqlens[b])
        c = torch.arange(n)
        pages = page_table[b, c // page_size].long()
        k, v = k_cache[pages, c % page_size], v_cache[pages, c % page_size]
        allowed = torch.ones(m, n, dtype=torch.bool)
        if causal:
            allowed = allowed.tril(diagonal=n - m)
        out[q0:q1] = _attend(q[q0:q1], k, v, allowed, scale)
    return out


def decode_emulator(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """SGLang's Triton ``decode_attention_fwd``: query ``b`` ([B, q_heads, d]) attends every key of its list."""
    out = q.new_zeros(q.shape[0], q.shape[1], v_pool.shape[-1])
    for b in range(q.shape[0]):
        index = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        allowed = torch.ones(1, index.numel(), dtype=torch.bool)
        out[b : b + 1] = _attend(q[b : b + 1], k_pool[index], v_pool[index], allowed, scale)
    return out


def ragged_order_emulator(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    out_cache_loc: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """FlashInfer's default *ragged* extend in SGLang (``flashinfer_backend.py`` ``forward_extend``).

    Per request: the ragged kernel attends the request's new K/V (``k_new`` rows, causal), the paged kernel
    its prefix ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` read from the pool *as it is now*, merged by LSE
    (one softmax here); only afterwards are ``k_new``/``v_new`` written to ``out_cache_loc`` (mutates the
    pools). A later run whose prefix holds an earlier run's rows therefore reads their stale K/V.
    """
    out = q.new_zeros(q.shape[0], q.shape[1], v_pool.shape[-1])
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        index = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        m, prefix = q1 - q0, index.numel()
        allowed = torch.cat(
            [torch.ones(m, prefix, dtype=torch.bool), torch.ones(m, m, dtype=torch.bool).tril()], dim=1
        )
        k = torch.cat([k_pool[index], k_new[q0:q1]])
        v = torch.cat([v_pool[index], v_new[q0:q1]])
        out[q0:q1] = _attend(q[q0:q1], k, v, allowed, scale)
    k_pool[out_cache_loc.long()] = k_new
    v_pool[out_cache_loc.long()] = v_new
    return out
