"""A sub-pass's rows in steps within the chunk budget, each planned once as groups and runs.

An upper pass runs layers ``S..L-1`` for rows of one request (exact rows and the tail, the probe, the splice
rows). Its rows go in steps of at most ``chunk_rows`` rows (SGLang's chunked-prefill budget), in position
order; within a step the rows below ``runs_from`` (exact rows scattered through the prefix) are packed into
groups of ``group_size`` rows and the rest (the tail) form runs. Each step is planned once, here, and its
attention metadata is built once per step and reused by every upper layer (``runtime/passes.py``): a step's
plan depends on positions and visible keys only, which no layer changes. Engine-free.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .planner import VirtualRequests, plan_groups, plan_virtual_requests

# Rows per group of scattered exact rows: a query tile of SGLang's Triton extend kernel on Hopper
# (BLOCK_M = 128 at head_dim <= 128), so a group fills its tile.
GROUP_SIZE = 128


@dataclass(frozen=True)
class Step:
    """Step ``index`` of the ``count`` steps of a pass: the pass rows ``rows``, their positions, their groups
    (the step's first rows) and runs. The step's virtual requests are the groups' then the runs', in row order."""

    index: int
    count: int
    rows: slice
    positions: torch.Tensor  # [m] int64 host, ascending
    groups: VirtualRequests | None
    runs: VirtualRequests | None

    @property
    def num_rows(self) -> int:
        return self.rows.stop - self.rows.start

    @property
    def group_rows(self) -> int:
        """Rows of the step that are in groups (its first ones)."""
        return 0 if self.groups is None else self.groups.num_rows

    @property
    def num_groups(self) -> int:
        return 0 if self.groups is None else self.groups.num_requests

    @property
    def num_requests(self) -> int:
        return sum(p.num_requests for p in self.parts)

    @property
    def parts(self) -> tuple[VirtualRequests, ...]:
        return tuple(p for p in (self.groups, self.runs) if p is not None)

    @functools.cached_property
    def lens(self) -> list[int]:
        """Query rows of each virtual request of the step."""
        return [n for p in self.parts for n in p.rows_per_request.tolist()]

    @functools.cached_property
    def seq_lens(self) -> list[int]:
        """Context length (last position + 1) of each virtual request of the step."""
        return [n for p in self.parts for n in p.seq_lens.tolist()]


def plan_steps(
    positions: torch.Tensor,
    visible: torch.Tensor | None = None,
    *,
    chunk_rows: int,
    group_size: int,
    runs_from: int | None = None,
) -> list[Step]:
    """The rows at ``positions`` ([n] int64 host, sorted unique) in steps of at most ``chunk_rows`` rows.

    ``visible``: [seq_len] bool host or None; ``runs_from``: rows at positions below it go in groups of
    ``group_size`` (``None``: every row is in a run, for passes over consecutive rows).
    """
    if type(chunk_rows) is not int or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be an int >= 1, got {chunk_rows!r}")
    n = int(positions.numel())
    grouped = 0 if runs_from is None else int(torch.searchsorted(positions, runs_from))
    steps = []
    count = -(-n // chunk_rows)
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        pos = positions[lo:hi]
        cut = min(max(grouped - lo, 0), hi - lo)  # rows of this step below runs_from
        groups = plan_groups(pos[:cut], visible, group_size=group_size) if cut else None
        runs = plan_virtual_requests(pos[cut:], visible) if cut < hi - lo else None
        steps.append(Step(len(steps), count, slice(lo, hi), pos, groups, runs))
    return steps
