"""The per-process RidgeFill runtime: admits requests, dispatches EXTEND batches, holds maps and policies.

One instance per scheduler process, created when SGLang has loaded the model (``patches.py``); the model
forward and the request hooks find it through :func:`get_runtime`. A request's state lives on SGLang's
``Req`` (``state.py``); the forward finds it by rid in :data:`~sgl_ridgefill.runtime.state.LIVE`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import torch

from ..vocabulary import EXACT_CACHE_NOTE
from . import prefill, recurrent
from .admission import Admission, Admitter, RequestFacts
from .distributed import RankFailure
from .passes import GROUP_SIZE, PassContext, plan_batch
from .prefill import SelectionResources
from .slicing import Slicer
from .upgrade import Upgrader
from .exact_rows import ExactRows
from .state import LIVE, LiveRequests, RequestState, report
from .subbatch import request_row_starts, requests_subbatch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from ..config import ServerConfig
    from .adapter import ModelAdapter
    from .distributed import TensorParallel
    from .maps_store import MapsStore
    from .split_state_store import SplitStateStore

logger = logging.getLogger("sgl_ridgefill")

_RUNTIME: RidgeFillRuntime | None = None
_WARN_EVERY_S = 60.0


def get_runtime() -> RidgeFillRuntime | None:
    return _RUNTIME


def set_runtime(rt: RidgeFillRuntime | None) -> None:
    global _RUNTIME
    _RUNTIME = rt


def stop_request(req, message: str) -> None:
    """Finish SGLang's ``req`` with a server error (HTTP 500 and ``message``) when its next result is checked:
    the way an abort in flight ends a request, without touching what the running batch holds."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.to_finish = FINISH_ABORT(message, HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError")


class RidgeFillRuntime:
    """``chunk_rows``: SGLang's chunked-prefill budget, the most rows one upper-pass step runs; ``tp``: this
    process's tensor-parallel group (``None`` on one device)."""

    def __init__(
        self,
        config: ServerConfig,
        adapter: ModelAdapter | None,
        admitter: Admitter,
        *,
        maps: MapsStore | None = None,
        resources: SelectionResources = SelectionResources(),
        chunk_rows: int = 8192,
        group_size: int = GROUP_SIZE,
        live: LiveRequests = LIVE,
        tp: TensorParallel | None = None,
        recurrent=None,
        census=None,
        split_states: SplitStateStore | None = None,
        slicer: Slicer | None = None,
        upgrader: Upgrader | None = None,
    ):
        self.config = config
        self.adapter = adapter
        self.admitter = admitter
        self.maps = maps
        self.resources = resources
        self.chunk_rows = chunk_rows
        self.group_size = group_size
        self.live = live
        self.tp = tp
        self.recurrent = recurrent  # hybrid models: recurrent.RecurrentResources
        self.census = census  # gpu_check.census_log.CensusLog when RIDGEFILL_CENSUS names a file, else None
        self.exact_rows = ExactRows()  # namespace mode: which cached rows are exact (row-exact reuse)
        self.split_states = split_states  # reselecting plans: split states of earlier requests' prefix rows
        self.slicer = slicer if slicer is not None else Slicer(0, allowed=False)  # short forwards (slicing.py)
        self.upgrader = upgrader if upgrader is not None else Upgrader(0, allowed=False)  # upgrade.py
        self._warned: dict[str, float] = {}

    @property
    def disabled(self) -> str | None:
        """Why RidgeFill does not run in this process (``None``: it runs)."""
        return self.admitter.facts.disabled

    def disable(self, reason: str) -> None:
        """Turn RidgeFill off for every request admitted from now on (each response says ``reason``)."""
        from dataclasses import replace

        if self.admitter.facts.disabled is None:
            logger.warning("RidgeFill is now off (every request runs exact prefill): %s", reason)
            self.admitter.facts = replace(self.admitter.facts, disabled=reason)

    # ----------------------------------------------------------------- admission (scheduler thread)
    def admit(self, custom_params: dict | None, request: RequestFacts = RequestFacts()) -> Admission:
        """The request's plan or why it runs exactly; raises ``RequestParamError`` for a bad request."""
        decision = self.admitter.admit(custom_params, request)
        if decision.plan is None and request.unsupported is not None:
            self._warn(f"requests with {request.unsupported} run exact prefill")
        return decision

    def _warn(self, message: str) -> None:
        """A warning at most once a minute per message: clients cannot flood the log."""
        now = time.monotonic()
        if now - self._warned.get(message, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[message] = now
            logger.warning(message)

    # ----------------------------------------------------------------- forward (model thread)
    def forward(self, original, lm, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, *args, **kwargs):
        """AROUND ``<Model>ForCausalLM.forward``: stock forward unless an EXTEND batch holds RidgeFill rows (a
        decode batch may first run a slice of a request's exact upgrade, ``upgrade.py``)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if fb.forward_mode == ForwardMode.DECODE and (st := self.upgrader.due(fb, self.live)) is not None:
            self._upgrade(st, fb)
        if (
            fb.forward_mode != ForwardMode.EXTEND
            or fb.input_embeds is not None
            or (args and args[0] is not None)
            or kwargs.get("input_embeds") is not None
            or kwargs.get("get_embedding")
            or kwargs.get("pp_proxy_tensors") is not None
            or not self.live.has_work(fb.rids)
        ):
            return original(lm, input_ids, positions, fb, *args, **kwargs)
        census = self.census.forward(self, fb) if self.census is not None else contextlib.nullcontext()
        with census:
            return self._forward(original, lm, input_ids, positions, fb, *args, **kwargs)

    def _note_cache_hit(self, st: RequestState) -> None:
        """``meta_info["ridgefill"]``: how many prompt rows came from the radix cache, and in namespace mode how
        many of those were exact (the rest filled); with ``watch_rows``, how many watched rows came from the
        cache (``watched_cached``) and how many of those were exact (``watched_cached_exact``)."""
        if st.start < 0:
            return
        st.stats.cached = st.start
        if st.plan.cache_mode == "namespace" and st.start:
            keys = st.row_keys(st.prompt_ids.tolist())
            if st.plan.reselects and st.runs:  # its selection may choose cached rows: which are exact already
                st.cached_exact_mask = self.exact_rows.exact_mask(keys, st.start)
                st.stats.cached_exact = int(st.cached_exact_mask.sum())
            else:
                st.stats.cached_exact = self.exact_rows.count_exact(keys, st.start)
            if st.start > st.boundary:  # tail rows taken from the cache: exact, or filled within the slack
                tail_rows = range(st.boundary, st.start)
                st.stats.tail_reused_filled = len(tail_rows) - self.exact_rows.exact_among(keys, tail_rows, st.start)[1]
            if st.plan.watch_rows:
                n, exact = self.exact_rows.exact_among(keys, st.plan.watch_rows, st.start)
                st.stats.update(watched_cached=n, watched_cached_exact=exact)

    def _forward(self, original, lm, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, *args, **kwargs):
        hidden_size = self.adapter.shape.hidden_size
        dtype = self.adapter.model.embed_tokens.weight.dtype
        starts = request_row_starts(fb)
        work: list[RequestState | None] = []
        for i, rid in enumerate(fb.rids):
            st = self.live.state(rid)
            if st is not None and st.runs and st.start < 0:
                n = int(fb.extend_seq_lens_cpu[i])
                rows = slice(starts[i], starts[i] + n)
                prefill.begin(st, fb, i, rows, hidden_size, dtype, chunk_ids=self._chunk_ids(rid, fb, i, n),
                              recurrent_sinks=self._recurrent_sinks(st), sinks=self._sinks(), streams=self._streams(st))
                self._note_cache_hit(st)
                _run_exact_over_exact_cache(st)
                if st.exact_reason is not None:
                    self._finish(rid, st)
            work.append(st if st is not None and st.runs else None)
        if all(w is None for w in work):
            return original(lm, input_ids, positions, fb, *args, **kwargs)

        backend = self.attn_backend()
        ctx = self._pass_context(backend, fb)
        with torch.no_grad():
            hidden = torch.zeros((input_ids.shape[0], hidden_size), dtype=dtype, device=input_ids.device)
            exact_idx = [i for i, w in enumerate(work) if w is None]
            if exact_idx:
                self._run_exact(backend, fb, exact_idx, hidden)
            for i, st in enumerate(work):
                if st is None:
                    continue
                try:
                    with recurrent.restored_on_failure(ctx, fb, i):
                        prefill.run_chunk(ctx, self.resources, fb, i, starts[i], st, hidden,
                                          req_row=self._req_row(fb, i))
                except Exception as e:  # noqa: BLE001 - on one device a request's failure must not stop the scheduler
                    self._fall_back(backend, fb, i, st, e, hidden)
                if st.prefill_done or st.exact_reason is not None:
                    self._finish(fb.rids[i], st)
            plan_batch(backend, fb)
            return lm.logits_processor(input_ids, hidden, lm.lm_head, fb)

    def _pass_context(self, backend, fb: ForwardBatch) -> PassContext:
        return PassContext(
            adapter=self.adapter,
            maps=self.maps,
            backend=backend,
            pool=backend.token_to_kv_pool,
            req_to_token=backend.req_to_token_pool.req_to_token,
            physical=fb.out_cache_loc_is_physical,
            chunk_rows=self.chunk_rows,
            group_size=self.group_size,
            tp=self.tp,
            recurrent=self.recurrent,
            split_states=self.split_states,
            slicer=self.slicer,
            upgrader=self.upgrader,
        )

    def _upgrade(self, st: RequestState, fb: ForwardBatch) -> None:
        """A slice of ``st``'s exact upgrade before decode batch ``fb`` runs its step. On a failure the upgrade
        stops there (the rows before its cursor stay exact, the others as they were) and the step runs."""
        from ..metrics import record_upgrade

        backend = self.attn_backend()
        req = self.live.req(fb.rids[0])
        try:
            with torch.no_grad():
                rows = self.upgrader.run(self._pass_context(backend, fb), fb, st, getattr(req, "output_ids", None) or [],
                                         req_row=self._req_row(fb, 0))
            record_upgrade(st.plan.arm, rows, done=st.upgrade.done)
        except Exception:  # noqa: BLE001 - the request's answer does not depend on its upgrade
            logger.exception("RidgeFill's exact upgrade of request %s failed; it stops at row %d", fb.rids[0],
                             st.upgrade.cursor)
            st.upgrade.done = True
            st.upgrade.close()
        finally:
            plan_batch(backend, fb)  # the decode batch's own attention metadata again

    def _fall_back(self, backend, fb: ForwardBatch, i: int, st: RequestState, error: Exception,
                   hidden: torch.Tensor) -> None:
        """Request ``i``'s RidgeFill raised ``error`` in this chunk: the chunk runs exactly (or the request
        stops, :meth:`RequestState.fail`). Under tensor parallelism no rank can do that alone: this rank
        raises :class:`~.distributed.RankFailure` and the server shuts down."""
        if self.tp is not None:
            raise RankFailure(self.tp, fb.rids[i], error) from error
        logger.exception("RidgeFill failed on request %s; its chunk runs exact prefill", fb.rids[i])
        st.fail(f"RidgeFill failed ({type(error).__name__}: {error})", chunk_start=int(fb.extend_prefix_lens_cpu[i]))
        self._run_exact(backend, fb, [i], hidden)
        if st.stop_reason is not None and (req := self.live.req(fb.rids[i])) is not None:
            stop_request(req, st.stop_reason)

    def _chunk_ids(self, rid: str, fb: ForwardBatch, i: int, n: int) -> torch.Tensor | None:
        """The token ids SGLang put in request ``i``'s chunk, from its ``Req`` on the host (the ids the batch
        was built from: its fill ids past the cached prefix), or ``None`` to read them from the batch."""
        req = self.live.req(rid)
        fill_ids = getattr(req, "get_fill_ids", None)
        if fill_ids is None:
            return None
        p0 = int(fb.extend_prefix_lens_cpu[i])
        return torch.tensor(list(fill_ids()[p0 : p0 + n]), dtype=torch.long)

    @staticmethod
    def _req_row(fb: ForwardBatch, i: int) -> int:
        """Request ``i``'s row of SGLang's request-to-token table, from the batch's host copy where it has one."""
        if fb.req_pool_indices_cpu is not None:
            return int(fb.req_pool_indices_cpu[i])
        return int(fb.req_pool_indices[i])

    def _sinks(self) -> bool:
        return self.maps is not None and bool(self.maps.folder.sink)

    def _run_exact(self, backend, fb: ForwardBatch, idx: list[int], hidden: torch.Tensor) -> None:
        """SGLang's own layers for the requests ``idx`` of the batch, as a batch of their own."""
        sub, rows = requests_subbatch(fb, idx)
        plan_batch(backend, sub)
        out = self.adapter.model(sub.input_ids, sub.positions, sub)
        hidden[rows] = out if isinstance(out, torch.Tensor) else out[0]

    def _streams(self, st: RequestState) -> bool:
        """Whether ``st``'s tail rows can run every layer in their own chunk (``RequestPlan.streams_tail``)."""
        return st.plan.streams_tail(recurrent=bool(self.adapter.recurrent_layers), sinks=self._sinks())

    def _recurrent_sinks(self, st: RequestState) -> bool:
        """Whether ``st``'s fill runs sink rows exactly on a model with recurrent (Gated DeltaNet) layers."""
        return bool(
            self.adapter.recurrent_layers and st.plan.arm == "ridgefill" and self.maps is not None
            and self.maps.folder.sink
        )

    def _finish(self, rid: str, st: RequestState) -> None:
        """Log, count and report (``meta_info["ridgefill"]``) a request whose prefill is decided."""
        from ..metrics import record_request

        summary = st.summary()
        req = self.live.req(rid)
        if req is not None:
            report(req, summary)
        if self.census is not None:
            self.census.finish(rid, summary)
        if self.tp is not None and not self.tp.first:
            return  # every rank runs the same requests: rank 0 logs and counts them
        if not summary["ran"]:
            logger.debug("ridgefill rid=%s ran exact: %s", rid, st.exact_reason)
            return
        logger.debug("ridgefill rid=%s %s", rid, " ".join(f"{k}={v}" for k, v in summary.items() if k != "ran"))
        record_request(st)

    @staticmethod
    def attn_backend():
        from sglang.srt.model_executor.forward_context import get_attn_backend

        return get_attn_backend()


def _run_exact_over_exact_cache(st: RequestState) -> None:
    """A reselecting request whose new rows all lie in its tail, over cached rows that are all exact (an exact
    upgrade made them so, ``upgrade.py``), has nothing to fill or choose: its new rows run exactly, as on stock
    SGLang. It still answers over KV that RidgeFill wrote (not bitwise stock's), so it reports ``"ran": true``."""
    mask = st.cached_exact_mask
    if st.runs and st.plan.reselects and 0 < st.boundary <= st.start and mask is not None and bool(mask.all()):
        st.over_upgraded_cache = True
        st.run_exact(EXACT_CACHE_NOTE)
