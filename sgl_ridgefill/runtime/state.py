"""A request's RidgeFill state, owned by SGLang's ``Req``, and how a forward finds it.

The state lives on the ``Req`` object itself (attribute :data:`ATTR`), so it has exactly the request's
lifetime: a request SGLang rejects, aborts in the queue or drops for any other reason takes its state
with it, and a later request that reuses the rid starts clean. A forward sees only rids, so
:class:`LiveRequests` keeps, per rid, a weak reference to the ``Req`` of the batch being built (published
when SGLang turns a batch into a ``ForwardBatch``); a rid of a request that is gone resolves to nothing.

Lifecycle: *admitted* when SGLang creates the ``Req`` (the plan is fixed), *bound* to its final prompt
when it first enters a batch (after session concatenation and scheduler-side truncation, so the plan
reads the prompt SGLang actually runs), *begun* at its first chunk (the radix-cache hit is known),
*done* when the prompt's last chunk ran, *released* when SGLang frees its KV (finish, abort,
retraction). A released request that comes back (retraction) runs exactly.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..attention.contract import serve_requests
from ..maps.kinds import ContextState
from .host_rows import HostRows
from .plan import RequestPlan
from .request_stats import RequestStats

ATTR = "ridgefill"  # attribute of SGLang's Req holding its RequestState
META_KEY = "ridgefill"  # meta_info["ridgefill"] of every response of a RidgeFill server


class _RidgeFillSkip:
    """The value RidgeFill gives ``Req.skip_radix_cache_insert`` (truthy like ``True``), so that release
    can tell its own "do not insert yet" from SGLang setting ``True`` later for a reason of its own."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "RIDGEFILL_SKIP"


RIDGEFILL_SKIP = _RidgeFillSkip()


@dataclass
class RequestState:
    """Per-request bookkeeping between admission and release (scheduler process only)."""

    plan: RequestPlan
    prior_skip: Any = False  # Req.skip_radix_cache_insert before admission
    prompt_ids: torch.Tensor | None = None  # [N] int64, the final prompt; None until bound
    logprob_start: int | None = None  # first prompt row whose logprob the request wants
    start: int = -1  # rows already in KV when the prefill began (radix-cache hit); -1 until the first chunk
    # PD: rows [0, exact_context) are exact on the decode worker (its own radix hit), so they run exact here too
    exact_context: int = 0
    exact_reason: str | None = None  # why the request runs exactly after all (None: RidgeFill runs)
    prefill_done: bool = False
    failed: bool = False  # the prefill raised part-way: whatever it wrote is never shared
    # Why the request must stop with an error after a failure (None: the exact fallback can answer it).
    stop_reason: str | None = None
    released: bool = False
    # Split states kept for the second sweep: the tail's (device), and the new prefix rows' (host memory)
    # when rows get selected or the maps have sink rows.
    tail_x: torch.Tensor | None = None  # [T, d]
    prefix_x: HostRows | None = None  # [B - start, d]
    # Query rows the current chunk's lower layers captured: (requirement, layer) -> [[rows, q*d]]; turned into
    # the attention statistics they add (``attention``: requirement -> [B] float32) in the same chunk.
    queries: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    stats: RequestStats = field(default_factory=RequestStats)  # what the prefill did (meta_info, logs, metrics)
    # nofill: keys the upper layers must not see in decode steps ([B] bool, True = hidden), set when done.
    hidden_keys: torch.Tensor | None = None
    context: ContextState | None = None  # a kv+context fill's state after the last row it saw
    sink_rows: list[int] = field(default_factory=list)  # prefix rows the maps were not fitted on (run exactly)
    # Until the last chunk reads them: per chunk, its first prefix position and its sink flags ([m] bool, device).
    sink_flags: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # Hybrid models with the terminal-state correction: the upper GDN layers' gate sums (recurrent.GateSums).
    recurrent: Any = None
    # Hybrid models whose fill has sink rows: the upper GDN states take the prefix in sweep 2 (prefill.begin).
    states_in_sweep_two: bool = False
    # Namespace mode: the prompt's row keys (exact_rows.prefix_keys), computed when first needed, and the prefix
    # rows that ran exactly (selected and sink rows, host), known once the prefill is done.
    streams: bool = False  # the tail's upper layers run chunk by chunk (prefill.begin decides)
    keys: Any = None
    exact_positions: list[int] = field(default_factory=list)
    # A reselecting plan (``RequestPlan.reselects``): which cached rows the cache holds exact ([start] bool
    # numpy, noted at the first chunk), and the cached rows this request made exact in place.
    cached_exact_mask: Any = None
    upgraded_positions: list[int] = field(default_factory=list)
    # Short forwards while others decode (``slicing.py``): tokens held back from the last chunk (0: none), the
    # chosen sweep not yet all run (``slicing.SweepTwo``), and whether the scheduler has let others decode since
    # the request's last forward.
    held_back: int = 0
    sweep: Any = None
    yielded: bool = False
    # The exact upgrade in the request's own decode steps (``upgrade.Upgrade``), once its prefill is done.
    upgrade: Any = None
    # Its new rows ran exactly over cached rows that RidgeFill requests wrote, every one exact (an exact upgrade
    # made them so): an answer from RidgeFill's KV, exact up to rounding but not bitwise stock's.
    over_upgraded_cache: bool = False

    def row_keys(self, token_ids) -> Any:
        """The keys of the rows of ``token_ids`` (the prompt, then any output) in this plan's namespace."""
        from .exact_rows import prefix_keys

        if self.keys is None or len(self.keys) < len(token_ids):
            self.keys = prefix_keys(self.plan.namespace, token_ids)
        return self.keys[: len(token_ids)]

    def exact_from(self) -> int:
        """The first row from which every row this request computed is exact (rows before it are exact only
        when listed in :meth:`exact_prefix_positions`)."""
        if not self.prefill_done:
            return 0
        if self.upgrade is not None and self.upgrade.cursor >= self.boundary:
            return self.upgrade.first
        return self.boundary

    def exact_prefix_positions(self) -> list[int]:
        """The prefix rows (before the boundary) this request computed exactly: its exact rows, and the rows its
        exact upgrade has rewritten so far."""
        if self.upgrade is None:
            return self.exact_positions
        return sorted(set(self.exact_positions).union(self.upgrade.exact_prefix_rows()))

    @property
    def bound(self) -> bool:
        return self.prompt_ids is not None

    @property
    def num_tokens(self) -> int:
        assert self.prompt_ids is not None, "the state is not bound to a prompt yet"
        return int(self.prompt_ids.numel())

    @property
    def boundary(self) -> int:
        """First tail row ``B = N - T``."""
        return max(0, self.num_tokens - self.plan.tail)

    @property
    def runs(self) -> bool:
        """Whether RidgeFill still has work for this request (not exact, not done, not released)."""
        return not self.released and self.exact_reason is None and not self.prefill_done

    def bind(self, prompt_ids, logprob_start: int | None) -> None:
        """Fix the prompt the plan runs on; decide here what only the prompt can decide."""
        self.prompt_ids = torch.as_tensor(list(prompt_ids), dtype=torch.long)
        self.logprob_start = logprob_start
        n, tail = self.num_tokens, self.plan.tail
        if n <= tail:
            self.run_exact(f"the prompt ({n} tokens) is not longer than the tail ({tail})")
        elif logprob_start is not None and logprob_start < n - tail:
            self.run_exact(
                f"prompt logprobs from row {logprob_start} would read filled rows (the tail starts at row "
                f"{n - tail}); set logprob_start_len >= {n - tail} or ask for exact"
            )

    def run_exact(self, reason: str) -> None:
        if self.exact_reason is None:
            self.exact_reason = reason
        self.free_buffers()

    def fail(self, error: str, *, chunk_start: int) -> None:
        """The prefill raised (``error`` says how) in the chunk starting at ``chunk_start``, which then runs
        exactly. The rows earlier chunks filled keep their filled KV (reported, never shared); tail rows of
        earlier chunks (which ran only the lower layers) leave the request nothing to answer from
        (:attr:`stop_reason`)."""
        self.failed = True
        reason = f"{error}; this chunk ran exactly"
        if self.bound:
            # Rows past the boundary are tail rows, never filled (their upper layers wait for the last chunk).
            filled = max(min(chunk_start, self.boundary) - self.start, 0) if self.plan.arm != "nofill" else 0
            if filled:
                reason += f"; the {filled} prompt rows of earlier chunks keep their filled KV"
                self.stats.filled_before_failure = filled
            first_tail = max(self.boundary, self.start)
            # A streaming plan's earlier tail rows ran every layer in their own chunk: nothing is deferred.
            deferred = 0 if self.streams else max(chunk_start - first_tail, 0)
            if deferred:
                # Their upper-layer KV (and, on hybrids, their upper recurrent state) was never written: no
                # fallback of this or a later chunk can compute an answer from it.
                self.stats.deferred_rows_lost = deferred
                self.stop_reason = (
                    f"{error}; the {deferred} tail rows [{first_tail}, {chunk_start}) of earlier chunks ran only "
                    "the lower layers, so no exact fallback can answer: the request stops"
                )
        self.run_exact(reason)

    def free_buffers(self) -> None:
        self.tail_x = self.prefix_x = self.context = self.sweep = None
        self.sink_flags = []
        self.queries.clear()
        self.attention.clear()

    def release(self) -> None:
        self.released = True
        self.free_buffers()
        if self.upgrade is not None:
            self.upgrade.close()

    def may_insert(self) -> bool:
        """Namespace mode: a request whose prefill completed (filled or exact) may publish its KV in its
        namespace; a partial prefill or a nofill request (its upper layers hold nothing) never does."""
        return (
            self.plan.cache_mode == "namespace"
            and self.plan.arm != "nofill"
            and self.bound
            and not self.failed
            and (self.prefill_done or (self.exact_reason is not None and self.start >= 0))
        )

    @property
    def reused_filled(self) -> int:
        """Filled rows this request took from the radix cache (namespace mode: cached rows not recorded exact)."""
        if self.stats.cached_exact is None:
            return 0
        return max(0, int(self.stats.get("cached", 0)) - int(self.stats.cached_exact))

    def summary(self) -> dict:
        """What ran, for the response's ``meta_info["ridgefill"]``. A request that ran its own rows exactly over
        filled rows from the cache answers from RidgeFill's KV all the same: ``"ran": true``, its reason kept
        as ``note``."""
        if self.exact_reason is not None and not self.reused_filled and not self.over_upgraded_cache:
            out = {"ran": False, "reason": self.exact_reason}
            for key in ("cached", "cached_exact", "filled_before_failure", "deferred_rows_lost"):
                if self.stats.get(key):
                    out[key] = self.stats.get(key)
            return out
        plan = self.plan
        out = {"ran": True, "arm": plan.arm, "split": plan.split, "tail": plan.tail, "cache_mode": plan.cache_mode}
        if plan.policy_name:
            out["policy"] = plan.policy_name
        if plan.splice is not None:
            out["splice"] = plan.splice
        out.update(self.stats.as_dict())
        if self.exact_reason is not None:
            out.setdefault("filled", 0)
            out.update(reused_filled=self.reused_filled, note=self.exact_reason)
        return out


def declined(reason: str) -> dict:
    """``meta_info["ridgefill"]`` of a request that runs exactly from the start."""
    return {"ran": False, "reason": reason}


def state_of(req: Any) -> RequestState | None:
    return getattr(req, ATTR, None)


def report(req: Any, summary: dict) -> None:
    """Put ``summary`` into the response's ``meta_info["ridgefill"]`` (a request-level customized-info key:
    SGLang sends it once, with the request's first output)."""
    info = dict(req.customized_info or {})
    info[META_KEY] = [summary]
    req.customized_info = info


class LiveRequests:
    """rid -> the ``Req`` of the batches being built, by weak reference.

    ``publish`` runs where SGLang builds a ``ForwardBatch`` from its ``ScheduleBatch`` (scheduler thread),
    ``state`` in the model forward. SGLang refuses a second live request with a rid that is in use, and a
    rid always maps to the ``Req`` that was last put in a batch, so a forward never reads the state of a
    request that is not in it.
    """

    def __init__(self) -> None:
        self._refs: dict[str, weakref.ref] = {}
        self._lock = threading.Lock()

    def publish(self, reqs) -> None:
        """Record the requests of a batch being built; bind new RidgeFill requests to their final prompt."""
        with self._lock:
            for req in reqs:
                st = state_of(req)
                if st is None or st.released:
                    self._refs.pop(req.rid, None)
                    continue
                if not st.bound:
                    st.bind(req.origin_input_ids, prompt_logprob_start(req))
                    if st.exact_reason is not None:
                        report(req, st.summary())
                self._refs[req.rid] = weakref.ref(req)
            self._count()

    def forget(self, req) -> None:
        with self._lock:
            ref = self._refs.get(req.rid)
            if ref is not None and ref() in (req, None):
                del self._refs[req.rid]
            self._count()

    def _count(self) -> None:
        """Drop the references of requests that are gone; report how many are alive (metrics)."""
        from ..metrics import set_live_requests

        for rid in [rid for rid, ref in self._refs.items() if ref() is None]:
            del self._refs[rid]
        set_live_requests(len(self._refs))

    def req(self, rid: str | None):
        if rid is None:
            return None
        ref = self._refs.get(rid)
        return None if ref is None else ref()

    def state(self, rid: str | None) -> RequestState | None:
        req = self.req(rid)
        st = None if req is None else state_of(req)
        return None if st is None or st.released else st

    def hidden_keys(self, rid: str | None, layer_id: int) -> torch.Tensor | None:
        """Keys (``[B]`` bool, True = hidden) a nofill request's decode step must not see in ``layer_id``."""
        if not self._refs:
            return None
        st = self.state(rid)
        if st is None or st.hidden_keys is None or layer_id < st.plan.split:
            return None
        return st.hidden_keys

    def has_work(self, rids) -> bool:
        """Whether any of ``rids`` is a RidgeFill request whose prefill still needs RidgeFill's forward."""
        if not self._refs or not rids:
            return False
        return any((st := self.state(rid)) is not None and st.runs for rid in rids)

    def has_hidden_keys(self, rids) -> bool:
        if not self._refs or not rids:
            return False
        return any((st := self.state(rid)) is not None and st.hidden_keys is not None for rid in rids)

    def __len__(self) -> int:
        """Live RidgeFill requests (dead references do not count)."""
        with self._lock:
            return sum(1 for ref in self._refs.values() if ref() is not None)


def prompt_logprob_start(req) -> int | None:
    """The first prompt row whose logprob the request wants, or ``None`` when it wants none but the last."""
    if not getattr(req, "return_logprob", False):
        return None
    start = getattr(req, "logprob_start_len", -1)
    n = len(req.origin_input_ids)
    if start is None or start < 0 or start >= n - 1:
        return None
    return int(start)


# The scheduler process's live RidgeFill requests (one per process; SGLang runs one scheduler per rank).
LIVE = LiveRequests()
serve_requests(LIVE)
