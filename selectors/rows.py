"""Ranked row sets: the one value every selector returns and every set operation consumes.

A ranked row set is a 1-D int64 tensor of unique prefix positions, best first. Ranking matters only
where a budget cuts a set short (``top``, ``budget``, ``reserve``); the final selection is sorted by
position. Set operations keep the left operand's order, so ``a | b`` ranks every row of ``a`` before
the rows only ``b`` adds.
"""

from __future__ import annotations

import math

import torch

# round(share * n) drifts below the true value for shares like 0.29 * 100 = 28.999...; the nudge keeps
# "29 %" of 100 rows at 29 rows without moving any honest half-way case.
_ROUNDING_SLACK = 1e-9


def empty_rows() -> torch.Tensor:
    """An empty ranked row set: ``[0]`` int64."""
    return torch.empty(0, dtype=torch.int64)


def share_count(share: float, n: int) -> int:
    """Rows in ``share`` of ``n``, rounded to the nearest integer (halves round up), within ``[0, n]``."""
    if n <= 0:
        return 0
    return max(0, min(n, math.floor(share * n + 0.5 + _ROUNDING_SLACK)))


def rank_by_score(scores: torch.Tensor) -> torch.Tensor:
    """Positions ordered by score, highest first; ties keep the earlier position first.

    scores: [n] float. Returns ranked rows: [n] int64. NaN scores rank last: a broken statistic must not
    push rows ahead of measured ones.
    """
    scores = scores.detach().to(torch.float64).flatten()
    scores = torch.nan_to_num(scores, nan=-math.inf)
    # Stable sort keeps ascending position order inside every tie.
    return torch.sort(scores, descending=True, stable=True).indices.to(torch.int64)


def rank_ascending(keys: torch.Tensor) -> torch.Tensor:
    """Positions ordered by key, lowest first; ties keep the earlier position first. keys: [n]."""
    return torch.sort(keys.detach().flatten(), stable=True).indices.to(torch.int64)


def top_rows(ranked: torch.Tensor, k: int) -> torch.Tensor:
    """The first ``k`` rows of a ranked set (all of it when it is shorter)."""
    return ranked[: max(0, k)]


def union_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows in ``a`` or ``b``: ``a`` in its order, then the rows only ``b`` has, in ``b``'s order."""
    if b.numel() == 0:
        return a
    if a.numel() == 0:
        return b
    return torch.cat([a, b[~torch.isin(b, a)]])


def intersect_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows in both ``a`` and ``b``, in ``a``'s order."""
    if a.numel() == 0 or b.numel() == 0:
        return empty_rows()
    return a[torch.isin(a, b)]


def difference_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows in ``a`` and not in ``b``, in ``a``'s order."""
    if a.numel() == 0 or b.numel() == 0:
        return a
    return a[~torch.isin(a, b)]


def sorted_rows(ranked: torch.Tensor) -> torch.Tensor:
    """The rows of a ranked set in ascending position order: ``[k]`` int64, unique."""
    return torch.unique(ranked.to(torch.int64))


def rows_where(mask: torch.Tensor) -> torch.Tensor:
    """Ascending positions where ``mask`` ([n] bool) holds, as ranked rows."""
    return torch.nonzero(mask, as_tuple=False).flatten().to(torch.int64)
