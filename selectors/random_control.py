"""``random``: the control every selector is judged against (the same number of rows, uniformly drawn).

Rows come from a per-request seed, so the identity and RidgeFill arms of one request draw the same rows.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import SelectionInputs
from .rows import share_count, sorted_rows
from .spec import ArgumentError, BindContext, Param, SelectorSpec


def random_permutation(prefix_len: int, seed: int) -> torch.Tensor:
    """A seeded permutation of the prefix: [prefix_len] int64. The same seed gives the same order."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(prefix_len, generator=generator, dtype=torch.int64)


def random_rows(count: int, prefix_len: int, seed: int) -> torch.Tensor:
    """``count`` distinct prefix rows drawn uniformly with ``seed``: sorted [min(count, prefix_len)] int64.

    The runtime's "+ random rows" control: repeat any selection with ``len(selection)`` random rows.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"random_rows: count must be a non-negative integer, got {count!r}")
    if not isinstance(prefix_len, int) or isinstance(prefix_len, bool) or prefix_len < 0:
        raise ValueError(f"random_rows: prefix_len must be a non-negative integer, got {prefix_len!r}")
    return sorted_rows(random_permutation(prefix_len, seed)[:count])


def random(inputs: SelectionInputs, *, count: int | None, share: float | None) -> torch.Tensor:
    """A uniform draw of `count` prefix rows (or `share` of the prefix) with the request's seed: the control.

    Same rows as ``random_rows(count, prefix_len, seed)``; ranked in draw order.
    """
    k = count if count is not None else share_count(share, inputs.prefix_len)
    return random_permutation(inputs.prefix_len, inputs.seed)[:k]


def _resolve(args: dict[str, Any], ctx: BindContext) -> dict[str, Any]:
    if (args["count"] is None) == (args["share"] is None):
        raise ArgumentError("random() needs exactly one of count (rows) or share (of the prefix)", None)
    return args


SPEC = SelectorSpec(
    name="random",
    fn=random,
    params=(
        Param("count", "int", "rows to draw", default=None, minimum=0, maximum=1 << 40),
        Param("share", "share", "share of the prefix to draw", default=None),
    ),
    resolve=_resolve,
    expected_rows=lambda args, n: min(args["count"], n) if args["count"] is not None else share_count(args["share"], n),
)
