"""Row queries of one request as virtual extend requests: runs, and groups of scattered rows.

A sub-pass runs query rows at sorted unique positions ``P`` of one request's context ``[0, seq_len)``; the row
at ``p`` attends to the keys ``{k <= p : visible[k]}``, the other rows' K/V included (they are written to the pool
before attention). Stock extend kernels run that as several extend requests of the same request:

- a **run** (:func:`plan_virtual_requests`): a maximal run of consecutive positions, an ordinary extend over
  the visible keys before it; no mask, as a stock extend;
- a **group** (:func:`plan_groups`): up to ``G`` scattered rows that read every visible key up to their last
  row from the pool under a mask ``key_pos <= q_pos``, built on the device (``metadata.py``).

Plans are host objects built from host tensors; what a backend needs on the device is derived from them in
``metadata.py``. Engine-free: imports torch and the standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import ledger

_I64 = torch.int64


@dataclass(frozen=True)
class VirtualRequests:
    """How the query rows of one sub-pass over one request split into virtual extend requests (CPU tensors).

    positions:         [n] int64, sorted unique query positions (row ``i`` of the sub-pass is ``positions[i]``)
    qo_indptr:         [R+1] int64, request ``j`` owns query rows ``qo_indptr[j]:qo_indptr[j+1]``
    is_group:          [R] bool, True = a group (masked ``key_pos <= q_pos``), False = a run (consecutive
                       positions, causal)
    key_indptr:        [R+1] int64
    visible_positions: [v] int64, the visible positions up to the last query position, ascending; the keys of
                       request ``j`` are its first ``key_indptr[j+1] - key_indptr[j]`` entries
    all_visible:       every position up to the last query row is visible (``visible_positions`` is
                       ``arange(v)``: key lists are prefixes of the request's slots)
    key_positions:     [key_indptr[-1]] int64 (property, built on first use), for request ``j`` the visible key
                       positions ``<=`` its last query position, ascending, its own query positions included
    """

    positions: torch.Tensor
    qo_indptr: torch.Tensor
    is_group: torch.Tensor
    key_indptr: torch.Tensor
    visible_positions: torch.Tensor
    all_visible: bool = False

    def __post_init__(self) -> None:
        r = self.is_group.numel()
        assert self.qo_indptr.shape == (r + 1,) and self.key_indptr.shape == (r + 1,)
        assert int(self.qo_indptr[-1]) == self.positions.numel()

    @functools.cached_property
    def key_positions(self) -> torch.Tensor:
        # Built on demand: R key lists can hold R * seq_len entries, which the backends never need on the host.
        return concat_prefixes(self.visible_positions, self.keys_per_request)

    @property
    def num_requests(self) -> int:
        return self.is_group.numel()

    @property
    def num_rows(self) -> int:
        return self.positions.numel()

    @functools.cached_property
    def rows_per_request(self) -> torch.Tensor:
        """[R] int64, query rows of each request."""
        return torch.diff(self.qo_indptr)

    @functools.cached_property
    def keys_per_request(self) -> torch.Tensor:
        """[R] int64, keys of each request (its own rows included)."""
        return torch.diff(self.key_indptr)

    @property
    def max_rows(self) -> int:
        return int(self.rows_per_request.max()) if self.num_requests else 0

    @functools.cached_property
    def seq_lens(self) -> torch.Tensor:
        """[R] int64, last query position + 1 of each request."""
        return self.positions[self.qo_indptr[1:] - 1] + 1

    @property
    def has_groups(self) -> bool:
        return bool(self.is_group.any())

    @functools.cached_property
    def admitted(self) -> torch.Tensor:
        """[n] int64, how many keys of its request's list each query row attends to (those ``<=`` its position)."""
        return torch.searchsorted(self.visible_positions, self.positions, right=True)


def runs_of(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [n] int64 CPU, sorted unique -> (starts [R], lengths [R]) of maximal consecutive runs."""
    positions = _checked_positions(positions, allow_empty=True)
    first = _run_first_rows(positions)
    return positions[first], torch.diff(first, append=first.new_tensor([positions.numel()]))


def plan_virtual_requests(positions: torch.Tensor, visible: torch.Tensor | None = None) -> VirtualRequests:
    """The query rows at ``positions`` as runs: one virtual request per maximal run of consecutive positions.

    positions: [n] int64 CPU, sorted unique; visible: [seq_len] bool CPU or None (all keys visible), with
    ``seq_len > positions[-1]`` and every query position visible.
    """
    positions = _checked_positions(positions, allow_empty=False)
    return _plan(positions, visible, _run_first_rows(positions), grouped=False)


def plan_groups(positions: torch.Tensor, visible: torch.Tensor | None = None, *, group_size: int) -> VirtualRequests:
    """The query rows at ``positions`` packed in sorted order into groups of ``group_size`` rows (the last may
    hold fewer), each one masked virtual request over the visible keys up to its last row.

    Takes the same ``positions`` and ``visible`` as :func:`plan_virtual_requests`. A group's rows need not be
    consecutive; its mask admits, for each row, the keys at or before the row's position.
    """
    positions = _checked_positions(positions, allow_empty=False)
    if type(group_size) is not int or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    first = torch.arange(0, positions.numel(), group_size, dtype=_I64)
    return _plan(positions, visible, first, grouped=True)


def _plan(positions: torch.Tensor, visible: torch.Tensor | None, first: torch.Tensor, *, grouped: bool) -> VirtualRequests:
    ledger.count(ledger.PLANNER_CALLS)
    visible_positions, all_visible = _visible_positions(positions, visible)
    n = positions.numel()
    qo_indptr = torch.cat([first, first.new_tensor([n])])
    last = positions[qo_indptr[1:] - 1]
    is_group = torch.full((first.numel(),), grouped, dtype=torch.bool)
    # Every request's keys are a prefix of the visible positions: those <= its last query position.
    if all_visible:
        key_counts = last + 1
    else:
        key_counts = torch.searchsorted(visible_positions, last, right=True)
    return VirtualRequests(positions, qo_indptr, is_group, indptr(key_counts), visible_positions, all_visible)


# ------------------------------------------------------------------------------------------- helpers


def indptr(lengths: torch.Tensor) -> torch.Tensor:
    """[R] -> [R+1] int64 exclusive prefix sums."""
    return torch.cat([torch.zeros(1, dtype=_I64), torch.cumsum(lengths, 0)])


def concat_prefixes(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[sum(lengths)]: ``values[:lengths[0]]``, ``values[:lengths[1]]``, ... end to end (``lengths`` host).

    One slice per request, copied by one ``cat`` on ``values``' device: the output can hold R * seq_len
    entries, and this copies each once without an index of that size."""
    if lengths.numel() == 0:
        return values[:0]
    counts = lengths.tolist()
    if len(counts) == 1:
        return values[: counts[0]]
    return torch.cat([values[:k] for k in counts])


def _run_first_rows(positions: torch.Tensor) -> torch.Tensor:
    """[R] int64, the row where each maximal run of consecutive positions starts."""
    if positions.numel() == 0:
        return positions.new_zeros(0)
    breaks = torch.nonzero(positions[1:] != positions[:-1] + 1).flatten() + 1
    return torch.cat([breaks.new_zeros(1), breaks])


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _checked_positions(positions: torch.Tensor, *, allow_empty: bool) -> torch.Tensor:
    """positions as [n] int64, or ValueError naming what is wrong with them."""
    if not isinstance(positions, torch.Tensor) or positions.ndim != 1 or positions.dtype not in _INTEGER_DTYPES:
        shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(
            f"positions must be a 1-D integer tensor, got {shape} of dtype {getattr(positions, 'dtype', None)}"
        )
    if positions.device.type != "cpu":
        raise ValueError(f"positions must be a CPU tensor (plans are computed on the host), got {positions.device}")
    if positions.numel() == 0:
        if allow_empty:
            return positions.to(_I64)
        raise ValueError("positions is empty: a sub-pass needs at least one query row")
    positions = positions.to(_I64)
    if int(positions[0]) < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions[0])}")
    bad = torch.nonzero(positions[1:] <= positions[:-1]).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"positions must be sorted and unique: positions[{i}]={int(positions[i])} is followed by "
            f"{int(positions[i + 1])}"
        )
    return positions


def check_mask(mask: torch.Tensor, name: str) -> None:
    if not isinstance(mask, torch.Tensor) or mask.ndim != 1 or mask.dtype != torch.bool:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a 1-D bool tensor, got {shape} of dtype {getattr(mask, 'dtype', None)}")
    if mask.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (plans are computed on the host), got {mask.device}")


def _visible_positions(positions: torch.Tensor, visible: torch.Tensor | None) -> tuple[torch.Tensor, bool]:
    """([v] int64 visible positions <= the last query position, whether they are all of them)."""
    last = int(positions[-1])
    if visible is None:
        return torch.arange(last + 1, dtype=_I64), True
    check_mask(visible, "visible")
    if visible.numel() <= last:
        raise ValueError(
            f"visible has {visible.numel()} entries but the last query position is {last}: it needs at least "
            f"{last + 1}"
        )
    hidden = positions[~visible[positions]]
    if hidden.numel():
        shown = hidden[:8].tolist()
        more = f" and {hidden.numel() - 8} more" if hidden.numel() > 8 else ""
        raise ValueError(f"query positions must be visible, but visible is False at positions {shown}{more}")
    shown = torch.nonzero(visible[: last + 1]).flatten()
    return shown, shown.numel() == last + 1
