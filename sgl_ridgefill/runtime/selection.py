"""Choosing a request's exact rows once its lower layers have run (the middle of the two-sweep prefill).

The selectors themselves are engine-free (``sgl_ridgefill.selectors``); this module gathers what they
need from the request's cache: the queries captured in the lower layers and the keys in the KV pool, turned
into "attention received per prefix row" without materialising the attention matrix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .plan import RequestState


def query_window(kind: str, q: int, num_tokens: int, boundary: int) -> tuple[int, int]:
    """Prompt rows whose queries a requirement reads: the last ``q`` (``"last"``) or the ``q`` just before
    the tail (``"before_tail"``, question-blind)."""
    if kind == "last":
        return max(0, num_tokens - q), num_tokens
    if kind == "before_tail":
        return max(0, boundary - q), boundary
    raise ValueError(f"unknown query window {kind!r}")


def random_rows_between(count: int, lo: int, hi: int, seed: int) -> torch.Tensor:
    """The random-rows control over the rows ``[lo, hi)`` this request computes (the selectors' draw,
    shifted past a radix-cache hit), sorted."""
    from ..selectors.registry import random_rows

    return random_rows(max(0, count), max(0, hi - lo), seed) + lo


def every_kth_row(k: int, lo: int, hi: int) -> torch.Tensor:
    """Rows ``lo + k - 1, lo + 2k - 1, ...`` below ``hi``."""
    return torch.arange(lo + k - 1, hi, k, dtype=torch.long)


def attention_received(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    *,
    k_pos: torch.Tensor | None = None,
    block: int = 2048,
) -> torch.Tensor:
    """Attention every key row receives from the queries, summed over query rows and heads.

    ``q``: ``[n_q, q_heads, d]``, ``k``: ``[n_k, kv_heads, d]`` at positions ``k_pos`` (default ``0..n_k-1``),
    ``q_pos``: ``[n_q]``; each query's softmax runs over the keys at or before its position. Two passes over
    key blocks (``kernels/attention_stats.py``): memory ``O(n_q · heads · block)``. Returns ``[n_k]`` float32.
    """
    from ..kernels.attention_stats import attention_received as kernel

    if k_pos is None:
        k_pos = torch.arange(k.shape[0], device=k.device)
    return kernel(q, k, q_pos.to(k.device), k_pos.to(k.device), scale, block=block)


def exact_rows_for(state: RequestState, policy_rows: torch.Tensor | None) -> torch.Tensor:
    """Apply the request's control and bounds to a selection: rows in ``[start, B)``, sorted and unique."""
    plan, lo, hi = state.plan, state.start, state.boundary
    if plan.exact_every is not None:
        rows = every_kth_row(plan.exact_every, lo, hi)
    elif policy_rows is not None:
        rows = torch.unique(policy_rows.to(torch.long).cpu())
        rows = rows[(rows >= lo) & (rows < hi)]
    else:
        rows = torch.empty(0, dtype=torch.long)
    if plan.control == "random":
        rows = random_rows_between(int(rows.numel()), lo, hi, plan.seed)
    return rows
