"""The exact upgrade without an engine: which finished prefills it takes, the decode batches it runs in, and
what the radix cache's record learns from it (``runtime/upgrade.py``; the engine test is in
``tests/engine/test_server.py``, on the Triton backend
``tests/gpu_backends/test_triton_upgrade.py``)."""

from __future__ import annotations

import types

import numpy as np
import torch

from sgl_ridgefill.runtime.host_rows import HostRows
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.runtime.state import RequestState
from sgl_ridgefill.runtime.upgrade import Upgrade, Upgrader, may_upgrade

N, TAIL, HIDDEN = 300, 100, 4


def _finished(*, start: int = 0, cached_exact=None, cache_mode: str = "namespace", **plan) -> RequestState:
    """A state whose prefill has chosen its rows: its split states still held."""
    kw = dict(arm="ridgefill", split=2, tail=TAIL, exact_rows=(5, 9), cache_mode=cache_mode)
    st = RequestState(plan=RequestPlan(**{**kw, **plan}))
    st.bind(list(range(N)), None)
    st.start = start
    st.cached_exact_mask = cached_exact
    st.prefix_x = HostRows(st.boundary - start, HIDDEN, torch.float32, torch.device("cpu"))
    st.prefix_x.write(0, torch.arange((st.boundary - start) * HIDDEN, dtype=torch.float32).view(-1, HIDDEN))
    st.tail_x = torch.zeros(TAIL, HIDDEN)
    return st


def test_only_a_reselecting_namespace_plan_over_an_exact_cache_is_upgraded():
    assert may_upgrade(_finished())
    assert not may_upgrade(_finished(cache_mode="no_insert"))  # nobody could reuse what it rewrites
    assert not may_upgrade(_finished(arm="nofill"))
    assert not may_upgrade(_finished(exact_rows=None))  # the bare fill: later questions already cost stock's
    assert may_upgrade(_finished(start=50, cached_exact=np.ones(50, dtype=bool)))
    # a cached row held filled: its split state is not the request's to rewrite from
    assert not may_upgrade(_finished(start=50, cached_exact=np.r_[np.ones(49, dtype=bool), False]))
    st = _finished()
    st.prefix_x = None
    assert not may_upgrade(st)


def test_the_upgrade_takes_the_split_states_and_reports_its_rows():
    upgrader = Upgrader(64, allowed=True)
    st = _finished(start=50, cached_exact=np.ones(50, dtype=bool))
    upgrader.begin(st)
    assert st.upgrade.first == st.upgrade.cursor == 50 and st.upgrade.prefix is st.prefix_x
    assert st.stats.exact_upgrade == N - 50
    for rows, allowed in ((0, True), (64, False)):  # off, or a server that cannot (TP, PD, hybrid, paged)
        other = _finished()
        Upgrader(rows, allowed=allowed).begin(other)
        assert other.upgrade is None


class _Live:
    def __init__(self, st):
        self.st = st

    def state(self, rid):
        return self.st if rid == "a" else None


def _decode_batch(*rids):
    return types.SimpleNamespace(batch_size=len(rids), rids=list(rids))


def test_a_slice_runs_only_when_the_request_decodes_alone_and_nothing_waits():
    upgrader = Upgrader(64, allowed=True)
    st = _finished()
    upgrader.begin(st)
    live = _Live(st)
    upgrader.note_round(types.SimpleNamespace(chunked_req=None, waiting_queue=[]))
    assert upgrader.due(_decode_batch("a"), live) is st
    assert upgrader.due(_decode_batch("a", "b"), live) is None  # another user's step would wait for it
    upgrader.note_round(types.SimpleNamespace(chunked_req=None, waiting_queue=["r"]))
    assert upgrader.due(_decode_batch("a"), live) is None  # a request waits for its prefill
    upgrader.note_round(types.SimpleNamespace(chunked_req=object(), waiting_queue=[]))
    assert upgrader.due(_decode_batch("a"), live) is None  # a chunked prefill is in progress
    upgrader.note_round(types.SimpleNamespace(chunked_req=None, waiting_queue=[]))
    st.upgrade.done = True
    assert upgrader.due(_decode_batch("a"), live) is None
    upgrader.note_round(object())  # a scheduler it cannot read: no upgrade, no error
    assert upgrader.quiet is False


def test_the_record_learns_the_rows_upgraded_so_far():
    st = _finished()
    st.prefill_done = True
    st.exact_positions = [5, 9]
    assert st.exact_from() == st.boundary and st.exact_prefix_positions() == [5, 9]
    st.upgrade = Upgrade(first=0, cursor=0, boundary=st.boundary, prompt_len=N, prefix=None, tail=None)
    st.upgrade.cursor = 40  # stopped part-way (the request finished first): rows [0, 40) are exact
    assert st.exact_from() == st.boundary
    assert st.exact_prefix_positions() == list(range(40))
    st.upgrade.cursor = N + 3  # every prompt row and three decoded ones
    assert st.exact_from() == 0
    st.release()
    assert st.upgrade.prefix is None and st.upgrade.tail is None  # the split states go with the request


def test_split_state_slices_are_copies():
    from sgl_ridgefill.runtime.upgrade import _split_states

    st = _finished()
    up = Upgrade(first=0, cursor=0, boundary=st.boundary, prompt_len=N, prefix=st.prefix_x, tail=st.tail_x)
    x = _split_states(up, 10, 12, torch.device("cpu"))
    assert torch.equal(x, st.prefix_x.buffer[10:12])
    x += 1  # a pass writing into its input must not change the kept split states
    assert not torch.equal(x, st.prefix_x.buffer[10:12])
    both = _split_states(up, st.boundary - 1, st.boundary + 2, torch.device("cpu"))
    assert both.shape == (3, HIDDEN) and torch.equal(both[1:], st.tail_x[:2])


def test_a_decode_step_that_runs_a_slice_is_not_replayed_from_a_captured_graph(monkeypatch):
    """On CUDA SGLang replays captured decode steps: the step that first runs a slice of an upgrade holds extend
    forwards in Python, so it runs eagerly; every other decode step keeps the graph."""
    from sgl_ridgefill import patches
    from sgl_ridgefill.runtime import runtime as runtime_module
    from sgl_ridgefill.runtime import state as state_module

    upgrader = Upgrader(64, allowed=True)
    st = _finished()
    upgrader.begin(st)
    live = _Live(st)
    live.has_hidden_keys = lambda rids: False
    monkeypatch.setattr(runtime_module, "_RUNTIME", types.SimpleNamespace(upgrader=upgrader))
    monkeypatch.setattr(state_module, "LIVE", live)
    upgrader.note_round(types.SimpleNamespace(chunked_req=None, waiting_queue=[]))

    def can_run(runner, fb):
        return True

    assert patches.around_decode_graph(can_run, None, _decode_batch("a")) is False
    assert patches.around_decode_graph(can_run, None, _decode_batch("a", "b")) is True
    st.upgrade.done = True
    assert patches.around_decode_graph(can_run, None, _decode_batch("a")) is True
