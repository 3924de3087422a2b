"""A compiled ``select`` statement: a tree of bound selectors and set operations, evaluated per request.

Semantics (documented for users in ``docs`` via ``policy explain``):

1. ``rows`` is evaluated to a ranked row set.
2. Without a budget, the selection is ``rows``. With a budget of ``k`` rows, each ``reserve R up to
   c`` takes the best ``min(c, rows left)`` rows of ``R`` first, in order; the best remaining rows of
   ``rows`` fill the budget.
3. ``plus`` rows are added outside the budget.
4. The result is sorted, unique and below the prefix length.

A percentage budget is a share of the prefix; inside ``top(E, p%)`` it is a share of ``E``. Counts
round to the nearest row (halves up) and never exceed the prefix.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Union

import torch

from sgl_ridgefill.selectors.base import Requirement, SelectionInputs
from sgl_ridgefill.selectors.rows import (
    difference_rows,
    empty_rows,
    intersect_rows,
    pick,
    rows_where,
    share_count,
    sorted_rows,
    top_rows,
    union_rows,
)
from sgl_ridgefill.selectors.spec import BoundSelector

_SET_OPS = {"|": union_rows, "&": intersect_rows, "-": difference_rows}


class _Evaluation:
    """Per-request memo: a selector used twice (e.g. in the rows and in a size budget) runs once."""

    def __init__(self, inputs: SelectionInputs) -> None:
        self.inputs = inputs
        self.memo: dict[BoundSelector, torch.Tensor] = {}


@dataclasses.dataclass(frozen=True)
class SelectorNode:
    selector: BoundSelector

    def rows(self, ev: _Evaluation) -> torch.Tensor:
        if self.selector not in ev.memo:
            ranked = self.selector(ev.inputs).detach().to("cpu", torch.int64).flatten()
            inside = (ranked >= 0) & (ranked < ev.inputs.prefix_len)
            ev.memo[self.selector] = ranked if bool(inside.all()) else pick(ranked, rows_where(inside))
        return ev.memo[self.selector]

    def expected(self, prefix_len: int) -> float:
        estimate = self.selector.expected_rows(prefix_len)
        return 0.0 if estimate is None else estimate

    def walk(self):
        yield self


@dataclasses.dataclass(frozen=True)
class SetOpNode:
    op: str
    left: Node
    right: Node

    def rows(self, ev: _Evaluation) -> torch.Tensor:
        return _SET_OPS[self.op](self.left.rows(ev), self.right.rows(ev))

    def expected(self, prefix_len: int) -> float:
        # Estimates assume the two sides pick rows independently.
        a, b = self.left.expected(prefix_len), self.right.expected(prefix_len)
        both = a * b / prefix_len if prefix_len else 0.0
        return {"|": a + b - both, "&": both, "-": a - both}[self.op]

    def walk(self):
        yield self
        yield from self.left.walk()
        yield from self.right.walk()


@dataclasses.dataclass(frozen=True)
class ShareLimit:
    """``p%``: of the prefix, or of the operand inside ``top``."""

    fraction: float

    def count(self, ev: _Evaluation, operand_rows: int | None) -> int:
        base = ev.inputs.prefix_len if operand_rows is None else operand_rows
        return share_count(self.fraction, base)

    def expected(self, prefix_len: int, operand_rows: float | None) -> float:
        return self.fraction * (prefix_len if operand_rows is None else operand_rows)

    def walk(self):
        return iter(())


@dataclasses.dataclass(frozen=True)
class CountLimit:
    rows: int

    def count(self, ev: _Evaluation, operand_rows: int | None) -> int:
        return min(self.rows, ev.inputs.prefix_len)

    def expected(self, prefix_len: int, operand_rows: float | None) -> float:
        return float(min(self.rows, prefix_len))

    def walk(self):
        return iter(())


@dataclasses.dataclass(frozen=True)
class SizeLimit:
    """``factor * size(operand)`` rows."""

    factor: float
    operand: Node

    def count(self, ev: _Evaluation, operand_rows: int | None) -> int:
        size = self.operand.rows(ev).numel()
        return max(0, min(ev.inputs.prefix_len, math.floor(self.factor * size + 0.5)))

    def expected(self, prefix_len: int, operand_rows: float | None) -> float:
        return min(float(prefix_len), self.factor * self.operand.expected(prefix_len))

    def walk(self):
        return self.operand.walk()


Limit = Union[ShareLimit, CountLimit, SizeLimit]


@dataclasses.dataclass(frozen=True)
class TopNode:
    operand: Node
    limit: Limit

    def rows(self, ev: _Evaluation) -> torch.Tensor:
        ranked = self.operand.rows(ev)
        return top_rows(ranked, self.limit.count(ev, ranked.numel()))

    def expected(self, prefix_len: int) -> float:
        operand = self.operand.expected(prefix_len)
        return min(operand, self.limit.expected(prefix_len, operand))

    def walk(self):
        yield self
        yield from self.operand.walk()
        yield from self.limit.walk()


Node = Union[SelectorNode, SetOpNode, TopNode]


@dataclasses.dataclass(frozen=True)
class SelectionPlan:
    """rows, an optional budget, reservations inside it, and rows added outside it."""

    rows: Node
    budget: Limit | None = None
    reserves: tuple[tuple[Node, Limit], ...] = ()
    plus: Node | None = None

    def walk(self):
        yield from self.rows.walk()
        if self.budget is not None:
            yield from self.budget.walk()
        for node, limit in self.reserves:
            yield from node.walk()
            yield from limit.walk()
        if self.plus is not None:
            yield from self.plus.walk()

    def selectors(self) -> tuple[BoundSelector, ...]:
        """Every bound selector, first use first, without repeats."""
        seen: dict[BoundSelector, None] = {}
        for node in self.walk():
            if isinstance(node, SelectorNode):
                seen.setdefault(node.selector)
        return tuple(seen)

    def requirements(self) -> tuple[Requirement, ...]:
        seen: dict[Requirement, None] = {}
        for selector in self.selectors():
            for req in selector.requirements:
                seen.setdefault(req)
        return tuple(seen)

    def select(self, inputs: SelectionInputs) -> torch.Tensor:
        """Selected prefix rows: sorted unique [k] int64, all below ``inputs.prefix_len``."""
        if inputs.prefix_len == 0:
            return empty_rows()
        ev = _Evaluation(inputs)
        ranked = self.rows.rows(ev)
        if self.budget is not None:
            left = self.budget.count(ev, None)
            chosen = empty_rows()
            for node, limit in self.reserves:
                take = min(limit.count(ev, None), left)
                reserved = top_rows(difference_rows(node.rows(ev), chosen), take)
                chosen = union_rows(chosen, reserved)
                left -= reserved.numel()
            ranked = union_rows(chosen, top_rows(difference_rows(ranked, chosen), left))
        if self.plus is not None:
            ranked = union_rows(ranked, self.plus.rows(ev))
        return sorted_rows(ranked)

    def expected_rows(self, prefix_len: int) -> float:
        """Rough expected selection size for a prefix of ``prefix_len`` rows (``policy explain``)."""
        if prefix_len <= 0:
            return 0.0
        total = self.rows.expected(prefix_len)
        if self.budget is not None:
            budget = self.budget.expected(prefix_len, None)
            reserved = 0.0
            for node, limit in self.reserves:
                reserved += min(node.expected(prefix_len), limit.expected(prefix_len, None), budget - reserved)
            total = min(budget, reserved + total)
        if self.plus is not None:
            total += self.plus.expected(prefix_len) * (1.0 - total / prefix_len)
        return max(0.0, min(float(prefix_len), total))
