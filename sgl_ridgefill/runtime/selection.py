"""Choosing a request's exact rows once its lower layers have run (the middle of the two-sweep prefill).

The selectors themselves are engine-free (``sgl_ridgefill.selectors``); this module gathers what they
need from the request's cache: the queries captured in the lower layers and the keys in the KV pool, turned
into "attention received per prefix row" without materialising the attention matrix, chunk by chunk as the
queries are computed. The statistics stay on the device until the prefill reads all of a request's selection
inputs in one copy (``prefill.py``). Rows below the request's radix-cache hit (``start``) are exact already
and never selected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .passes import PassContext
    from .state import RequestState


def query_window(kind: str, q: int, num_tokens: int, boundary: int, start: int = 0) -> tuple[int, int]:
    """Prompt rows whose queries a requirement reads: the last ``q`` (``"last"``) or the ``q`` just before
    the tail (``"before_tail"``, question-blind), never below ``start`` (rows the radix cache held: their
    lower layers did not run, so their queries do not exist). The window may be empty."""
    if kind == "last":
        lo, hi = max(0, num_tokens - q), num_tokens
    elif kind == "before_tail":
        lo, hi = max(0, boundary - q), boundary
    else:
        raise ValueError(f"unknown query window {kind!r}")
    return max(lo, start), max(hi, start)


def chunk_query_rows(req, st: RequestState, first: int, rows: int) -> tuple[int, int]:
    """The prompt rows ``[a, b)`` of a chunk (rows ``[first, first + rows)``) in the query window of the
    attention requirement ``req`` for this request; empty when ``a >= b``. What the chunk's lower pass
    captures and what it adds to the statistics."""
    lo, hi = query_window(req.query, req.q, st.num_tokens, st.boundary, st.start)
    return max(lo, first), min(hi, first + rows)


def random_rows_between(count: int, lo: int, hi: int, seed: int) -> torch.Tensor:
    """The random-rows control over the rows ``[lo, hi)`` this request computes (the selectors' draw,
    shifted past a radix-cache hit), sorted."""
    from ..selectors.registry import random_rows

    return random_rows(max(0, count), max(0, hi - lo), seed) + lo


def every_kth_row(k: int, lo: int, hi: int) -> torch.Tensor:
    """Rows ``lo + k - 1, lo + 2k - 1, ...`` below ``hi`` (none when the range is shorter than ``k``)."""
    if lo + k - 1 >= hi:
        return torch.empty(0, dtype=torch.long)
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
    ``q_pos``: ``[n_q]``; each query's softmax runs over the keys at or before its position, in blocks
    (``kernels/attention_stats.py``): memory ``O(n_q · heads · block)``. Returns ``[n_k]`` float32.
    """
    from ..kernels.attention_stats import attention_received as kernel

    if k_pos is None:
        k_pos = torch.arange(k.shape[0], device=k.device)
    return kernel(q, k, q_pos, k_pos, scale, block=block)


def accumulate_statistics(ctx: PassContext, st: RequestState, requirements, slots: torch.Tensor, first: int,
                          rows: int) -> None:
    """Add the attention that a chunk's captured queries (prompt rows ``[first, first + rows)``, lower layers
    just run) give every prefix row to ``st.attention`` (``[B]`` float32 per ``AttentionRequirement``, on the
    device), then drop the captures. Each query's softmax is whole already: it sees the keys at or before its
    position, all in the pool once its chunk's lower layers ran. So the statistics are summed chunk by chunk,
    each chunk's share in the forward that computes its queries, and the chunk that holds the last prompt token
    computes only its own. ``slots``: ``[first + rows]`` the request's pool slots."""
    from ..selectors.base import AttentionRequirement

    ad = ctx.adapter
    device = slots.device
    for req in requirements:
        if not isinstance(req, AttentionRequirement):
            continue
        a, b = chunk_query_rows(req, st, first, rows)
        for layer_id in req.layers:
            chunks = st.queries.pop((req, layer_id), [])
            if not chunks or a >= b:
                continue
            q = torch.cat(chunks).reshape(b - a, -1, ad.shape.head_dim)
            k = ctx.pool.get_key_buffer(layer_id)[slots[:b]]
            scale = ad.attention(layer_id).scaling
            received = attention_received(q.float(), k.float(), torch.arange(a, b, device=device), scale)
            seen = min(b, st.boundary)
            total = st.attention.get(req)
            if total is None:
                total = st.attention[req] = torch.zeros(st.boundary, dtype=torch.float32, device=device)
            total[:seen] += received[:seen]


def attention_statistics(st: RequestState, requirements, device: torch.device) -> dict:
    """Attention received by every prefix row (``[B]`` float32, on the device) per ``AttentionRequirement``,
    summed over the chunks (:func:`accumulate_statistics`); zeros for a requirement no query reached."""
    from ..selectors.base import AttentionRequirement

    out = {}
    for req in requirements:
        if isinstance(req, AttentionRequirement):
            out[req] = st.attention.get(req)
            if out[req] is None:
                out[req] = torch.zeros(st.boundary, dtype=torch.float32, device=device)
    return out


def select_rows(st: RequestState, statistics: dict, probes: dict, *, tokens: Any = None, token_counts=None) -> torch.Tensor:
    """The request's exact rows: sorted unique positions in ``[start, B)`` (``[0, B)`` for a plan that
    reselects: a fresh fill's choice, the cached rows included); the sink rows of the fill (``st.sink_rows``)
    are always among them, and every row below ``st.exact_context``."""
    from ..selectors.base import SelectionInputs

    plan, lo, hi = st.plan, (0 if st.plan.reselects else st.start), st.boundary
    if plan.exact_every is not None:
        rows = every_kth_row(plan.exact_every, lo, hi)
    elif plan.exact_rows is not None:
        rows = torch.tensor(plan.exact_rows, dtype=torch.long)
        rows = rows[(rows >= lo) & (rows < hi)]
    elif plan.policy is not None:
        inputs = SelectionInputs(
            token_ids=st.prompt_ids,
            prefix_len=st.boundary,
            seed=plan.seed,
            tokens=tokens,
            token_counts=token_counts,
            attention=statistics,
            probe=probes,
        )
        rows = torch.unique(plan.policy.select(inputs).to(torch.long).cpu())
        rows = rows[(rows >= lo) & (rows < hi)]
    else:
        rows = torch.empty(0, dtype=torch.long)
    if plan.control == "random":
        rows = random_rows_between(int(rows.numel()), lo, hi, plan.seed)
    if st.sink_rows:  # rows the maps were not fitted on: exact, outside any selection
        rows = torch.unique(torch.cat([rows, torch.tensor(st.sink_rows, dtype=torch.long)]))
    if st.exact_context > lo:  # PD: the decode worker holds these rows exactly; so must the tail here
        rows = torch.unique(torch.cat([rows, torch.arange(lo, min(st.exact_context, hi), dtype=torch.long)]))
    return rows


def watched_rows(watch: tuple[int, ...], exact: torch.Tensor, lo: int, hi: int) -> dict[str, int]:
    """What the ``watch_rows`` diagnostic reports: how many watched positions lie in the new prefix ``[lo, hi)``
    (``watched``) and how many of those are among the ``exact`` rows (``watched_exact``)."""
    rows = torch.tensor(watch, dtype=torch.long)
    rows = rows[(rows >= lo) & (rows < hi)]
    return {"watched": int(rows.numel()), "watched_exact": int(torch.isin(rows, exact.cpu()).sum())}
