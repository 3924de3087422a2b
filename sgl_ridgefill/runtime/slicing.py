"""A RidgeFill prefill in short forwards, with other requests' decode steps between them.

SGLang runs a request's chunks back to back; a decoding request waits for all of them. A RidgeFill plan whose
tail streams (the bare fill) runs no forward longer than a stock chunk of the same rows. A plan with a second
sweep (selected or sink rows) runs its last forward longer. While other requests decode, the :class:`Slicer`
keeps every forward of such a request short and lets them decode between its forwards:

1. **Short chunks.** Each chunk takes at most ``rows`` tokens (the scheduler's chunk limit).
2. **Yield.** After each of the request's forwards, the scheduler runs one decode step of the others before the
   next (:meth:`Slicer.defer`, SGLang's own prefill deferral).
3. **A sliced second sweep.** A selecting plan runs its second sweep (the exact rows and the tail through the
   upper layers, ``prefill.py``) in the forward that holds the last prompt token: too long a forward. So its
   chunk that would end the prompt ends :data:`HELD_BACK` tokens short. In it, the held-back tokens also run
   their lower layers, into scratch KV slots taken from SGLang's allocator for that forward only, so that the
   selection reads the queries of every row of its windows and chooses what an unsliced prefill chooses; then it
   selects. Each next chunk is one token; its forward runs that token's lower layers again, into the real slots,
   and one slice of the sweep: about ``rows`` of its rows, in position order, through every upper layer. The
   chunk with the last prompt token takes what is left of the prompt and runs the last slice, which holds every
   held-back row.

Slices in position order give every row the keys and values the unsliced sweep gives it: a row reads the
upper-layer K/V of the rows before it, written by earlier slices (or filled), as a chunked prefill does. Only
a plan whose sweep needs nothing of all its rows at once slices: not with the value rescale (every row's layer
input), a probe, nofill's hidden keys, a splice, or a hybrid model's recurrent layers. The server cuts only on
one device, not on a PD prefill worker, at page size 1 (cuts at any token). With nobody decoding, a prefill
runs as SGLang schedules it. Engine-free: the scheduler's objects are read by attribute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .state import RequestState

logger = logging.getLogger(__name__)

# Tokens held back from the last chunk: the most slices a sweep runs in (one per held-back token).
HELD_BACK = 8


def sliceable(st: RequestState) -> bool:
    """Whether ``st``'s plan may run its second sweep in slices (the server's side: :class:`Slicer`)."""
    from ..selectors.base import ProbeRequirement

    plan = st.plan
    if not plan.has_selection or plan.value_rescale or plan.splice is not None or plan.arm == "nofill":
        return False
    if st.states_in_sweep_two or st.exact_context:
        return False
    requirements = getattr(plan.policy, "requirements", ()) if plan.policy is not None else ()
    return not any(isinstance(r, ProbeRequirement) for r in requirements)


def plan_slices(rows: int, held_from: int, slice_rows: int, most: int = HELD_BACK) -> list[slice]:
    """The sweep's ``rows`` rows (in position order) in at most ``most`` slices of about ``slice_rows``
    rows; rows from ``held_from`` on (the held-back tokens, whose real slots exist only at the last chunk) are
    all in the last slice."""
    if rows <= 0:
        return [slice(0, 0)]
    count = max(1, min(most, -(-rows // max(1, slice_rows))))
    cuts = sorted({min(round(j * rows / count), held_from) for j in range(count)}) + [rows]  # held rows: last
    return [slice(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


@dataclass
class SweepTwo:
    """A request's second sweep, chosen and not yet (all) run: its rows in position order (``positions``,
    ``[r]`` int64 host: the cached rows it upgrades, the new exact rows, the tail), the split states of the rows
    before the tail (``x_before``, ``[u + e, hidden]`` on the device; the tail's are read from ``st.tail_x`` when
    their slice runs, so held-back rows get the values their real chunks computed), what the pass needs of the
    plan, and the slices still to run."""

    positions: torch.Tensor
    x_before: torch.Tensor
    first_tail: int
    exact: torch.Tensor
    upgrade: torch.Tensor
    new: torch.Tensor
    slices: list[slice]
    visible: Any = None
    before_layer: Any = None
    recurrence: Any = None
    done: int = 0  # slices run
    shape: dict | None = None  # the passes' shape, summed over the slices run

    @property
    def slices_left(self) -> int:
        return len(self.slices) - self.done

    def rows_of(self, sl: slice, tail_x: torch.Tensor, boundary: int) -> torch.Tensor:
        """The split states of the slice's rows: ``[rows, hidden]``."""
        nb = int(self.x_before.shape[0])
        parts = []
        if sl.start < nb:
            parts.append(self.x_before[sl.start : min(sl.stop, nb)])
        if sl.stop > nb:
            off = self.first_tail - boundary
            parts.append(tail_x[off + max(sl.start, nb) - nb : off + sl.stop - nb])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class Slicer:
    """The server's slicing: ``rows`` (the most rows of work one forward of a RidgeFill request does while others
    decode; 0: never cut), the scheduler's allocator for the held-back tokens' scratch slots, and whether this
    server may cut at all (``allowed``: one device, no PD prefill worker, a dense model, page size 1)."""

    def __init__(self, rows: int, *, allowed: bool, allocator: Any = None, sinks: bool = False) -> None:
        self.rows = rows if allowed else 0
        self.allocator = allocator
        self.sinks = sinks  # the maps have a sink rule: the ridgefill arm runs sink rows in a second sweep
        self.decoding = False  # whether the running batch decodes, noted every scheduling round

    def defer(self, chunked_req: Any, running_batch: Any) -> bool:
        """The scheduler's round begins: note whether others decode; ``True`` to skip this round's prefill
        once after each forward of the chunked RidgeFill request while they do, so that a decode step runs.
        Never raises (SGLang's scheduler loop calls it): on an error, ``False``."""
        self.decoding = running_batch is not None and not running_batch.is_empty() and not getattr(
            running_batch, "is_prefill_only", False)
        try:
            return self._defer(chunked_req)
        except Exception:  # noqa: BLE001 - one request must not stop the scheduler: SGLang's schedule
            logger.exception("RidgeFill's prefill deferral failed; SGLang schedules as usual")
            return False

    def _defer(self, chunked_req: Any) -> bool:
        st = self._sweeping(chunked_req)
        if st is None or st.yielded or not self.decoding or st.start < 0:
            return False
        st.yielded = True
        st.stats.add(yields=1)
        return True

    def chunk_limit(self, req: Any, budget: int) -> int | None:
        """The most tokens the next chunk of SGLang's ``req`` may take, of the ``budget`` left in the batch
        (``None``: no limit of RidgeFill's). While others decode: ``rows``; and a selecting plan's chunk that
        would end the prompt (or leave at most :data:`HELD_BACK` tokens) ends :data:`HELD_BACK` tokens short,
        then one token per slice of its sweep, and the rest with the last slice. Never raises (SGLang's
        scheduler loop calls it): on an error, ``None``."""
        try:
            return self._chunk_limit(req, budget)
        except Exception:  # noqa: BLE001 - one request must not stop the scheduler: SGLang's chunks
            logger.exception("RidgeFill's chunk limit failed; SGLang sizes the chunk as usual")
            return None

    def _chunk_limit(self, req: Any, budget: int) -> int | None:
        st = self._sweeping(req)
        if st is None:
            return None
        n = st.num_tokens if st.bound else len(req.origin_input_ids)
        done = int(req.prefix_len)
        if st.held_back and done >= n - st.held_back:
            return 1 if st.sweep is not None and st.sweep.slices_left > 1 else None
        if not (self.rows and self.decoding):
            return n - st.held_back - done if st.held_back else None
        if not st.held_back and done + min(budget, self.rows) + HELD_BACK >= n and self._may_hold_back(st, req, n, done):
            st.held_back = HELD_BACK  # this chunk ends the prompt, or would leave too few tokens to hold back
        return min(self.rows, n - st.held_back - done)

    def _sweeping(self, req: Any) -> RequestState | None:
        """The state of ``req`` when it is a RidgeFill request with a second sweep (a plan whose tail streams
        runs no forward longer than a stock chunk of the same rows: SGLang's chunks suit it) that wants no
        prompt logprobs (those need the prompt in one chunk: cut, it would run exactly)."""
        from .state import prompt_logprob_start

        st = _state(req)
        if st is None or not self.rows or st.plan.streams_tail(recurrent=False, sinks=self.sinks):
            return None
        return st if prompt_logprob_start(req) is None else None

    def _may_hold_back(self, st: RequestState, req: Any, n: int, done: int) -> bool:
        """More than :data:`HELD_BACK` tokens are left and in the tail, and scratch slots can be had."""
        return self.allocator is not None and n - done > HELD_BACK and n > st.plan.tail > HELD_BACK and sliceable(st)

    def scratch(self, count: int) -> torch.Tensor | None:
        """``count`` free KV slots for one forward (give them back with :meth:`release`), or ``None``."""
        return None if self.allocator is None else self.allocator.alloc(count)

    def release(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)


def _state(req: Any) -> RequestState | None:
    from .state import state_of

    st = state_of(req) if req is not None else None
    return st if st is not None and st.runs else None
