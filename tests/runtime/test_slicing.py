"""A RidgeFill prefill in short forwards while others decode (no engine): the chunk limits the scheduler gets,
the rounds it defers, and the slices of a second sweep whose request holds back its last tokens."""

from __future__ import annotations

import types

import pytest
import torch

from sgl_ridgefill.runtime import slicing
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.runtime.slicing import HELD_BACK, Slicer, SweepTwo, plan_slices
from sgl_ridgefill.runtime.state import ATTR, RequestState

N, TAIL = 1000, 100


def test_slices_cover_the_rows_in_order_and_keep_the_held_back_rows_last():
    slices = plan_slices(1536, 1530, 256)
    assert len(slices) == 6 and slices[0].start == 0 and slices[-1].stop == 1536
    assert all(a.stop == b.start for a, b in zip(slices, slices[1:]))
    assert slices[-1].start <= 1530  # every held-back row in the last slice
    assert len(plan_slices(10_000, 9_990, 256)) == HELD_BACK  # never more slices than held-back tokens
    assert plan_slices(100, 95, 256) == [slice(0, 100)]
    # Held-back rows reaching below the even cut: the last slice grows, no row is lost or repeated.
    slices = plan_slices(40, 25, 10, most=4)
    assert slices[-1].start == 25 and sum(s.stop - s.start for s in slices) == 40
    assert plan_slices(40, 5, 10, most=4) == [slice(0, 5), slice(5, 40)]
    assert plan_slices(0, 0, 256) == [slice(0, 0)]


class _Batch:
    def __init__(self, reqs: int, prefill_only: bool = False) -> None:
        self.reqs, self.is_prefill_only = reqs, prefill_only

    def is_empty(self) -> bool:
        return self.reqs == 0


def _request(plan: RequestPlan | None = None, *, done: int) -> types.SimpleNamespace:
    st = RequestState(plan=plan or RequestPlan(arm="ridgefill", split=2, tail=TAIL, exact_every=7))
    st.bind(list(range(N)), None)
    st.start = 0
    req = types.SimpleNamespace(prefix_len=done)
    setattr(req, ATTR, st)
    return req


def _slicer(rows: int = 4096) -> Slicer:
    return Slicer(rows, allowed=True, allocator=object())


def test_chunks_are_short_only_while_others_decode():
    slicer = _slicer(256)
    req = _request(done=0)
    assert slicer.defer(req, _Batch(0)) is False and slicer.chunk_limit(req, 4096) is None  # nobody decodes
    slicer.defer(req, _Batch(2, prefill_only=True))  # prefill-only requests do not decode
    assert slicer.chunk_limit(req, 4096) is None
    slicer.defer(req, _Batch(2))
    assert slicer.chunk_limit(req, 4096) == 256 and getattr(req, ATTR).held_back == 0
    assert slicer.chunk_limit(req, 100) == 256  # SGLang's own budget still applies: the smaller wins there
    req.prefix_len = N - 256 - 5  # the next 256 would leave too few tokens to hold back: hold back now
    assert slicer.chunk_limit(req, 4096) == 256 + 5 - HELD_BACK and getattr(req, ATTR).held_back == HELD_BACK


def test_the_chunk_that_would_end_the_prompt_ends_short_only_while_others_decode():
    slicer = _slicer(4096)
    req = _request(done=600)
    slicer.defer(req, _Batch(0))
    assert slicer.chunk_limit(req, 4096) is None and getattr(req, ATTR).held_back == 0
    slicer.defer(req, _Batch(2))
    assert slicer.chunk_limit(req, 200) == N - 600  # this chunk does not end the prompt: nothing decided yet
    assert getattr(req, ATTR).held_back == 0
    assert slicer.chunk_limit(req, 4096) == N - HELD_BACK - 600
    assert getattr(req, ATTR).held_back == HELD_BACK


def test_slicing_chunks_are_one_token_until_the_last_slice():
    slicer = _slicer(4096)
    req = _request(done=600)
    st = getattr(req, ATTR)
    slicer.defer(req, _Batch(1))
    slicer.chunk_limit(req, 4096)
    req.prefix_len = 700  # the scheduler cut that chunk shorter still: keep steering to the held-back point
    assert slicer.chunk_limit(req, 4096) == N - HELD_BACK - 700
    slicer.defer(req, _Batch(0))  # even when nobody decodes any more
    assert slicer.chunk_limit(req, 4096) == N - HELD_BACK - 700
    req.prefix_len = N - HELD_BACK
    st.sweep = SweepTwo(torch.arange(3), torch.zeros(0, 4), N - TAIL, *(torch.zeros(0),) * 3,
                        slices=[slice(0, 1), slice(1, 2), slice(2, 3)])
    assert slicer.chunk_limit(req, 4096) == 1
    st.sweep.done = 2
    assert slicer.chunk_limit(req, 4096) is None  # the last slice takes what is left of the prompt


def test_one_decode_step_after_each_forward():
    slicer = _slicer()
    req = _request(done=N - HELD_BACK)
    st = getattr(req, ATTR)
    assert slicer.defer(req, _Batch(1)) is True
    assert slicer.defer(req, _Batch(1)) is False  # once: the next round runs the request's next chunk
    st.yielded = False  # a chunk ran
    assert slicer.defer(req, _Batch(0)) is False  # nobody to yield to
    assert slicer.defer(req, _Batch(1)) is True and st.stats.yields == 2
    assert slicer.defer(None, _Batch(1)) is False
    st.start = -1  # not begun: its first chunk has not run
    st.yielded = False
    assert slicer.defer(req, _Batch(1)) is False


def test_a_plan_whose_tail_streams_keeps_sglangs_chunks():
    """The bare fill runs no forward longer than a stock chunk of the same rows: nothing to cut."""
    slicer = _slicer(256)
    req = _request(RequestPlan(arm="ridgefill", split=2, tail=TAIL), done=0)
    assert slicer.defer(req, _Batch(1)) is False and slicer.chunk_limit(req, 4096) is None
    sinks = Slicer(256, allowed=True, allocator=object(), sinks=True)  # unless the maps' sink rows run exactly
    sinks.defer(None, _Batch(1))
    assert sinks.chunk_limit(req, 4096) == 256


@pytest.mark.parametrize("plan", [
    RequestPlan(arm="ridgefill", split=2, tail=TAIL, exact_every=7, value_rescale=8),
    RequestPlan(arm="nofill", split=2, tail=TAIL, exact_every=7),
    RequestPlan(arm="ridgefill", split=2, tail=TAIL, exact_every=7, splice="keys"),
])
def test_plans_whose_sweep_needs_all_its_rows_at_once_are_not_sliced(plan):
    slicer = _slicer(4096)
    req = _request(plan, done=600)
    slicer.defer(req, _Batch(1))
    assert slicer.chunk_limit(req, 4096) == N - 600 and not slicing.sliceable(getattr(req, ATTR))
    assert getattr(req, ATTR).held_back == 0


def test_a_server_that_cannot_cut_keeps_sglangs_chunks():
    for slicer in (Slicer(256, allowed=False, allocator=object()), Slicer(0, allowed=True, allocator=object())):
        req = _request(done=600)
        assert slicer.defer(req, _Batch(1)) is False
        assert slicer.chunk_limit(req, 4096) is None
    slicer = Slicer(4096, allowed=True, allocator=None)  # no allocator: short chunks, but no scratch to hold back
    req = _request(done=600)
    slicer.defer(req, _Batch(1))
    assert slicer.chunk_limit(req, 4096) == N - 600 and getattr(req, ATTR).held_back == 0


def test_a_short_tail_or_remainder_is_not_held_back():
    slicer = _slicer(4096)
    req = _request(RequestPlan(arm="ridgefill", split=2, tail=HELD_BACK, exact_every=7), done=600)
    slicer.defer(req, _Batch(1))
    assert slicer.chunk_limit(req, 4096) == N - 600  # the held-back rows must be tail rows
    req = _request(done=N - HELD_BACK)
    slicer.defer(req, _Batch(1))
    assert slicer.chunk_limit(req, 4096) == HELD_BACK and getattr(req, ATTR).held_back == 0  # too little left


def test_the_sweep_reads_the_tail_split_states_when_its_slice_runs():
    x_before = torch.arange(6.0).reshape(3, 2)
    tail_x = torch.arange(100.0, 120.0).reshape(10, 2)  # rows from the boundary 50
    sweep = SweepTwo(torch.arange(13), x_before, 52, *(torch.zeros(0),) * 3, slices=[slice(0, 5), slice(5, 11)])
    assert torch.equal(sweep.rows_of(slice(0, 5), tail_x, 50), torch.cat([x_before, tail_x[2:4]]))
    assert torch.equal(sweep.rows_of(slice(5, 11), tail_x, 50), tail_x[4:10])
    assert torch.equal(sweep.rows_of(slice(1, 3), tail_x, 50), x_before[1:3])


def test_a_first_chunk_that_would_end_the_prompt_is_cut_short_too():
    """A request that fits one chunk is not bound to its prompt yet when SGLang admits it: the prompt is its
    input ids, the radix hit its prefix length."""
    slicer = _slicer(4096)
    st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=TAIL, exact_every=7))
    req = types.SimpleNamespace(prefix_len=64, origin_input_ids=list(range(N)))
    setattr(req, ATTR, st)
    slicer.defer(None, _Batch(1))
    assert slicer.chunk_limit(req, 4096) == N - HELD_BACK - 64
    wants_logprobs = types.SimpleNamespace(prefix_len=0, origin_input_ids=list(range(N)), return_logprob=True,
                                           logprob_start_len=N - 10)
    setattr(wants_logprobs, ATTR, RequestState(plan=st.plan))
    assert slicer.chunk_limit(wants_logprobs, 4096) is None  # prompt logprobs need the prompt in one chunk
    small = _slicer(64)
    small.defer(None, _Batch(1))
    assert small.chunk_limit(wants_logprobs, 4096) is None  # not even cut to the rows per forward
    short = types.SimpleNamespace(prefix_len=0, origin_input_ids=list(range(TAIL)))
    setattr(short, ATTR, RequestState(plan=st.plan))
    assert slicer.chunk_limit(short, 4096) == TAIL  # no longer than its tail: it runs exactly


class _Adder:
    """The budget side of SGLang's PrefillAdder: a chunk takes what it may of the budget."""

    def __init__(self, budget: int) -> None:
        self.rem_chunk_tokens, self.chunked_req_limit, self.new_chunked_req = budget, None, None

    def add_one_req(self, req, *args):
        take = min(req.origin_input_ids.__len__() - req.prefix_len, self.rem_chunk_tokens)
        if take < len(req.origin_input_ids) - req.prefix_len:
            self.new_chunked_req = req
        self.rem_chunk_tokens -= take
        return "CONTINUE"

    def add_chunked_req(self, req):
        take = min(len(req.origin_input_ids) - req.prefix_len, self.rem_chunk_tokens, self.chunked_req_limit or 10**9)
        self.rem_chunk_tokens -= take
        return req if take < len(req.origin_input_ids) - req.prefix_len else None


@pytest.fixture
def runtime(monkeypatch):
    from sgl_ridgefill.runtime import runtime as runtime_module

    rt = types.SimpleNamespace(slicer=_slicer())
    monkeypatch.setattr(runtime_module, "_RUNTIME", rt)
    rt.slicer.defer(None, _Batch(1))
    return rt


def test_a_cut_chunk_takes_the_batch_budget(runtime):
    """SGLang tracks one chunked request: a chunk RidgeFill cuts short leaves no budget for another request to
    start chunked prefill beside it, as a stock chunk that does not end its prompt leaves none."""
    from sgl_ridgefill import patches

    adder = _Adder(4096)
    req = types.SimpleNamespace(prefix_len=0, origin_input_ids=list(range(N)))
    setattr(req, ATTR, RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=TAIL, exact_every=7)))
    patches.around_add_one_req(_Adder.add_one_req, adder, req, False, None)
    assert adder.new_chunked_req is req and adder.rem_chunk_tokens == 0
    assert getattr(req, ATTR).held_back == HELD_BACK

    st = getattr(req, ATTR)
    st.bind(list(range(N)), None)
    st.start = 0
    req.prefix_len = N - HELD_BACK
    st.sweep = SweepTwo(torch.arange(2), torch.zeros(0, 4), N - TAIL, *(torch.zeros(0),) * 3,
                        slices=[slice(0, 1), slice(1, 2)])
    adder = _Adder(4096)
    assert patches.around_add_chunked_req(_Adder.add_chunked_req, adder, req) is req  # one token, still chunked
    assert adder.rem_chunk_tokens == 0
    st.sweep.done = 1
    adder = _Adder(4096)
    assert patches.around_add_chunked_req(_Adder.add_chunked_req, adder, req) is None  # the rest: prefill ends
    assert adder.rem_chunk_tokens == 4096 - HELD_BACK


def test_a_request_ridgefill_does_not_cut_keeps_the_budget_it_left(runtime):
    from sgl_ridgefill import patches

    adder = _Adder(4096)
    req = types.SimpleNamespace(prefix_len=0, origin_input_ids=list(range(N)))  # not a RidgeFill request
    patches.around_add_one_req(_Adder.add_one_req, adder, req, False, None)
    assert adder.new_chunked_req is None and adder.rem_chunk_tokens == 4096 - N


def test_rows_per_forward_default_to_three_thirty_seconds_of_sglangs_chunk():
    from sgl_ridgefill.runtime.factory import slice_rows

    assert (slice_rows(None, 4096), slice_rows(None, 8192), slice_rows(None, -1), slice_rows(None, None)) == (
        384, 768, 768, 768)
    assert (slice_rows(0, 4096), slice_rows(300, 4096)) == (0, 300)


def test_upgrade_rows_default_to_an_eighth_of_sglangs_chunk():
    from sgl_ridgefill.runtime.factory import upgrade_rows

    assert (upgrade_rows(None, 4096), upgrade_rows(None, 8192), upgrade_rows(None, -1), upgrade_rows(None, None)) == (
        512, 1024, 1024, 1024)
    assert (upgrade_rows(0, 4096), upgrade_rows(300, 4096)) == (0, 300)


def test_a_request_the_slicer_cannot_read_keeps_sglangs_schedule():
    """The slicer runs in SGLang's scheduler loop, outside the runtime's per-request fallback: whatever one
    request holds, it answers "no limit, no deferral" instead of raising there."""
    slicer = _slicer(256)
    req = _request(done=0)
    getattr(req, ATTR).plan = None  # a state no plan can be read from
    assert slicer.defer(req, _Batch(1)) is False
    assert slicer.chunk_limit(req, 4096) is None
