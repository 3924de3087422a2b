"""The exact upgrade: after its first token, a RidgeFill request runs the upper layers its fill skipped, in its
own decode steps, so that later questions on its document reuse exact KV at stock's cost.

A plan that chooses exact rows again over a reused cache (``RequestPlan.reselects``) makes each later question
on a cached document pay, inside its own prefill, for the chosen rows the cache holds filled. The upgrade moves
that work out of the later questions' time to first token. Once a request's prefill is done, each of its decode
steps that runs it alone (no other request in the batch, none waiting, none in chunked prefill) first rewrites
the next ``rows`` rows of its sequence, in position order from its first new row, through layers ``S..L-1``
over its own slots: prefix rows from their split states (kept in host memory since the prefill), tail rows from
the tail's, and decoded tokens through every layer from their embeddings. Every row then reads exact keys and
values of the rows before it, as in a chunked exact prefill. After the last slice the request's sequence holds
the KV an exact prefill would have written (up to kernel rounding), and so does every token it decodes from
then on.

When the request ends (finished, aborted or retracted), its rows upgraded so far enter its plan's namespace as
exact (``exact_rows.py``), so a later request chooses and upgrades only the others. A later request of the plan
whose cached rows are all exact and whose new rows all lie in its tail runs exactly, as stock SGLang would
(``"ran": false``). Upgraded KV stays in the plan's namespace: exact requests never read it, since it was
computed in other batch shapes than a stock prefill and is not bitwise what stock would cache.

Only a request whose cached rows before its first new row are all exact (a new document, or one upgraded
already) and whose sweep may run in slices (``slicing.sliceable``), on one device, a dense model and page size
1. Engine-free apart from the passes: the scheduler's objects are read by attribute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..attention.staging import to_device
from . import passes
from .slicing import sliceable

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .host_rows import HostRows
    from .passes import PassContext
    from .state import RequestState

logger = logging.getLogger(__name__)


@dataclass
class Upgrade:
    """A request's upgrade in progress: rows ``[first, cursor)`` are exact again; the split states of rows
    ``[first, boundary)`` (``prefix``, host memory) and ``[boundary, prompt_len)`` (``tail``, the device)."""

    first: int
    cursor: int
    boundary: int
    prompt_len: int
    prefix: HostRows | None
    tail: torch.Tensor | None
    done: bool = False  # every row before the token being decoded is exact

    def close(self) -> None:
        self.prefix = self.tail = None

    def exact_prefix_rows(self) -> range:
        """The prefix rows (before the boundary) made exact so far."""
        return range(self.first, min(self.cursor, self.boundary))


def may_upgrade(st: RequestState) -> bool:
    """Whether ``st``'s finished prefill can be upgraded: a reselecting ridgefill plan in namespace mode whose
    sweep runs in slices, with new prefix rows, their split states and the tail's kept, and every cached row
    before them exact."""
    plan = st.plan
    if not (plan.reselects and plan.cache_mode == "namespace" and plan.arm == "ridgefill" and sliceable(st)):
        return False
    if st.prefix_x is None or st.tail_x is None or not 0 <= st.start < st.boundary:
        return False
    return st.start == 0 or (st.cached_exact_mask is not None and bool(st.cached_exact_mask.all()))


class Upgrader:
    """The server's exact upgrade: ``rows`` per decode step (0: off); ``allowed``: one device, no PD prefill
    worker, a dense model, page size 1."""

    def __init__(self, rows: int, *, allowed: bool) -> None:
        self.rows = rows if allowed else 0
        self.quiet = False  # noted every scheduling round: no request waits or runs chunked prefill

    def note_round(self, scheduler: Any) -> None:
        """The scheduler's round begins: whether a prefill waits or is in progress. Never raises."""
        try:
            self.quiet = scheduler.chunked_req is None and not len(scheduler.waiting_queue)
        except Exception:  # noqa: BLE001 - SGLang's scheduler loop calls this: on a surprise, no upgrade
            logger.exception("RidgeFill could not read the scheduler's queue; no exact upgrade this round")
            self.quiet = False

    def begin(self, st: RequestState) -> None:
        """``st``'s prefill is done (its buffers not freed yet): keep what its upgrade needs."""
        if self.rows and may_upgrade(st):
            st.upgrade = Upgrade(first=st.start, cursor=st.start, boundary=st.boundary, prompt_len=st.num_tokens,
                                 prefix=st.prefix_x, tail=st.tail_x)
            st.stats.update(exact_upgrade=st.num_tokens - st.start)

    def due(self, fb: ForwardBatch, live: Any) -> RequestState | None:
        """The request whose upgrade runs a slice in this decode batch, or ``None``: the batch holds one
        request, with an upgrade not done, and nothing else waits."""
        if not self.rows or not self.quiet or fb.batch_size != 1 or not fb.rids:
            return None
        st = live.state(fb.rids[0])
        if st is None or st.upgrade is None or st.upgrade.done:
            return None
        return st

    def run(self, ctx: PassContext, fb: ForwardBatch, st: RequestState, output_ids, *, req_row: int) -> int:
        """One slice of ``st``'s upgrade in decode batch ``fb`` (request 0), before the batch's own step.
        ``output_ids``: the tokens decoded so far that the host knows (row ``prompt_len + j`` holds the ``j``-th).
        Returns the rows rewritten."""
        up = st.upgrade
        seq_len = int(fb.seq_lens_cpu[0]) if fb.seq_lens_cpu is not None else int(fb.seq_lens[0])
        written = seq_len - 1  # rows whose KV exists before this step's token
        end = min(written, up.prompt_len + len(output_ids))
        lo, hi = up.cursor, min(up.cursor + self.rows, end)
        if hi > lo:
            slots = ctx.req_to_token[req_row, :written]
            ids = torch.cat([st.prompt_ids, torch.as_tensor(list(output_ids[: max(hi - up.prompt_len, 0)]),
                                                             dtype=torch.long)])
            sub = passes.as_extend(fb)
            split, device = st.plan.split, fb.input_ids.device
            cut = min(hi, up.prompt_len)
            if cut > lo:  # prompt rows: their split states, through the upper layers
                x = _split_states(up, lo, cut, device)
                passes.upper_pass(ctx, sub, 0, split, torch.arange(lo, cut), ids, x, slots=slots, runs_from=lo)
            if hi > max(lo, up.prompt_len):  # decoded tokens: every layer, from their embeddings
                first = max(lo, up.prompt_len)
                (tokens,) = to_device(device, ids[first:hi].to(fb.input_ids.dtype))
                passes.upper_pass(ctx, sub, 0, 0, torch.arange(first, hi), ids, ctx.adapter.embed(tokens),
                                  slots=slots, runs_from=first)
            up.cursor = hi
        if up.cursor >= written:
            up.done = True
            up.close()
        return hi - lo if hi > lo else 0


def _split_states(up: Upgrade, lo: int, hi: int, device: torch.device) -> torch.Tensor:
    """Split states of prompt rows ``[lo, hi)``: ``[hi - lo, hidden]`` on ``device``, a copy (the passes may
    write into their input)."""
    parts = []
    if lo < up.boundary:
        parts.append(up.prefix.slice_on_device(lo - up.first, min(hi, up.boundary) - up.first))
    if hi > up.boundary:
        parts.append(up.tail[max(lo, up.boundary) - up.boundary : hi - up.boundary])
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone()
