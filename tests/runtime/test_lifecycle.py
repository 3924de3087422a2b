"""A request's RidgeFill state lives on SGLang's ``Req``: admitted at creation, bound to the final prompt when
the request enters a batch, released on every path out. Driven through the real hooks of ``patches.py``
with stand-ins for SGLang's ``Req`` and ``_create_generation_req`` (no engine needed); each test names the
reliability finding it pins (C1, C5, ...: a request, however odd, must neither stop the scheduler nor
be served filled KV it did not ask for)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from sgl_ridgefill import patches
from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.runtime.admission import Admitter, ServerFacts
from sgl_ridgefill.runtime.runtime import RidgeFillRuntime, set_runtime
from sgl_ridgefill.runtime.state import LIVE, META_KEY, RIDGEFILL_SKIP, LiveRequests, state_of

FACTS = ServerFacts(num_layers=4, maps_splits=(2,), maps_id="m", default_split=2)


class FakeReq:
    """The parts of SGLang's ``Req`` RidgeFill touches."""

    def __init__(self, rid, origin_input_ids, extra_key=None, session=None, **_):
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.extra_key = extra_key
        self.session = session
        self.skip_radix_cache_insert = False
        self.customized_info = None
        self.return_logprob = False
        self.logprob_start_len = -1
        self.aborted = None

    def set_finish_with_abort(self, message):
        self.aborted = message
        self.origin_input_ids = [0]


def _original(scheduler, recv_req, *args, **kwargs):
    ids = kwargs.pop("origin_input_ids", None) or recv_req.input_ids
    return FakeReq(recv_req.rid, ids, **kwargs)


def _recv(rid, ids, ridgefill=None, extra_key=None):
    custom = {"ridgefill": ridgefill} if ridgefill is not None else None
    return SimpleNamespace(rid=rid, input_ids=list(ids), sampling_params=SimpleNamespace(custom_params=custom),
                           extra_key=extra_key, cache_salt=None, logprob_start_len=-1)


@pytest.fixture()
def runtime():
    cfg = ServerConfig(prefill_backend="ridgefill", maps="m", tail=8, diagnostics=True)
    rt = RidgeFillRuntime(cfg, None, Admitter(cfg, FACTS))
    set_runtime(rt)
    saved = LIVE._refs.copy()  # noqa: SLF001
    LIVE._refs.clear()  # noqa: SLF001
    yield rt
    set_runtime(None)
    LIVE._refs.clear()  # noqa: SLF001
    LIVE._refs.update(saved)  # noqa: SLF001


def create(recv, **kwargs):
    return patches.around_create_generation_req(_original, None, recv, **kwargs)


def release(req):
    return patches.around_release_kv_cache(lambda *a, **k: None, req, None)


def test_a_dropped_request_takes_its_state_with_it(runtime):
    """C1: a request SGLang rejects or aborts in the queue never reaches release; a later request reusing
    its rid must not run with the old plan, nor on the old prompt."""
    first = create(_recv("x", range(40), {"tail": 8}))
    assert state_of(first) is not None
    del first  # rejected: SGLang drops the Req without releasing it
    gc.collect()
    second = create(_recv("x", range(30), {"enabled": False}))
    LIVE.publish([second])
    assert state_of(second) is None and LIVE.state("x") is None
    assert len(LIVE) == 0


def test_no_state_is_left_after_rejected_aborted_and_retracted_requests(runtime):
    rejected = create(_recv("a", range(40), {}))
    queued = create(_recv("b", range(40), {}))
    running = create(_recv("c", range(40), {}))
    retracted = create(_recv("d", range(40), {}))
    LIVE.publish([running, retracted])
    assert len(LIVE) == 2
    release(running)  # aborted in flight: SGLang releases its KV
    release(retracted)  # retraction releases the KV, then the request waits to be prefilled again
    LIVE.publish([retracted])
    assert LIVE.state("d") is None  # it comes back as an exact request
    del rejected, queued  # never in a batch: nothing to find
    gc.collect()
    assert len(LIVE) == 0 and LIVE.state("a") is None and LIVE.state("b") is None


def test_session_requests_are_planned_from_the_whole_prompt(runtime):
    """C3: a session turn's Req holds history + new turn; planning from the new turn alone overflowed."""
    recv = _recv("s", range(20), {})
    history_and_turn = list(range(100, 150)) + list(range(20))
    req = create(recv, origin_input_ids=history_and_turn)
    LIVE.publish([req])
    assert state_of(req).prompt_ids.tolist() == history_and_turn


def test_truncated_prompts_are_planned_from_what_the_scheduler_keeps(runtime):
    """C4: --allow-auto-truncate shortens origin_input_ids after the Req is created."""
    req = create(_recv("t", range(400), {}))
    req.origin_input_ids = req.origin_input_ids[:256]
    LIVE.publish([req])
    st = state_of(req)
    assert st.num_tokens == 256 and st.boundary == 256 - 8


def test_streaming_sessions_run_exact(runtime):
    """C9: a streaming session keeps a turn's KV row for the next turn, whatever that turn asks for."""
    req = create(_recv("z", range(40), {}), session=SimpleNamespace(streaming=True))
    assert state_of(req) is None
    assert req.customized_info[META_KEY][0]["ran"] is False


def test_a_client_cannot_name_a_ridgefill_namespace(runtime):
    """C10: the scheduler itself refuses the namespace mark, not only the tokenizer."""
    req = create(_recv("k", range(40), None, extra_key="a|rf:rf:00"), extra_key="a|rf:rf:00")
    assert req.aborted is not None and "reserved for RidgeFill's cache namespace" in req.aborted


def test_release_clears_only_the_skip_ridgefill_set(runtime):
    """C11: namespace mode re-enabled insertion even when SGLang had disabled it since."""
    cfg = ServerConfig(prefill_backend="ridgefill", maps="m", tail=8, cache_mode="namespace")
    set_runtime(RidgeFillRuntime(cfg, None, Admitter(cfg, FACTS)))
    done, vetoed, partial = (create(_recv(r, range(40), {})) for r in "pqr")
    for req in (done, vetoed, partial):
        assert req.skip_radix_cache_insert is RIDGEFILL_SKIP
        LIVE.publish([req])
        state_of(req).start = 0
    state_of(done).prefill_done = state_of(vetoed).prefill_done = True
    vetoed.skip_radix_cache_insert = True  # SGLang: e.g. the KV never landed
    for req in (done, vetoed, partial):
        release(req)
    assert done.skip_radix_cache_insert is False  # its completed prefill goes into its namespace
    assert vetoed.skip_radix_cache_insert is True
    assert partial.skip_radix_cache_insert is True  # never a partial prefill


def test_namespace_matches_stop_at_the_request_boundary_and_its_slack(runtime):
    """C12: a shorter request's tail must not be served from a longer request's filled prefix, but for its
    slack: an eighth of its tail (1 row of 8 here; 3 of 24)."""
    for tail, reach in ((8, 33), (24, 19)):
        cfg = ServerConfig(prefill_backend="ridgefill", maps="m", tail=tail, cache_mode="namespace")
        set_runtime(RidgeFillRuntime(cfg, None, Admitter(cfg, FACTS)))
        req = create(_recv(f"n{tail}", range(40), {}))
        assert patches.around_compute_max_prefix_len(lambda r, n: n - 1, req, 40) == reach
    exact = create(_recv("e", range(40), {"enabled": False}))
    assert patches.around_compute_max_prefix_len(lambda r, n: n - 1, exact, 40) == 39


def test_every_response_says_what_ran(runtime):
    """Requests that run exactly say why in meta_info["ridgefill"]."""
    req = create(_recv("m", range(40), {"enabled": False}))
    assert req.customized_info[META_KEY] == [{"ran": False, "reason": "the request asked for exact prefill"}]
    short = create(_recv("short", range(5), {}))
    LIVE.publish([short])
    reason = "the prompt (5 tokens) is not longer than the tail (8)"
    assert state_of(short).exact_reason == reason
    assert short.customized_info[META_KEY] == [{"ran": False, "reason": reason}]


def test_live_requests_resolve_only_live_reqs():
    live = LiveRequests()
    req = FakeReq("r", range(20))
    live.publish([req])
    assert live.state("r") is None  # no RidgeFill state: nothing to find
    assert live.req("r") is None


def test_a_failure_after_earlier_filled_chunks_says_so():
    """A prefill that raises runs that chunk exactly; the rows earlier chunks filled are named in the report
    (a failure in the first chunk leaves nothing filled)."""
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    def failed_at(chunk_start, arm="ridgefill"):
        st = RequestState(plan=RequestPlan(arm=arm, split=2, tail=8))
        st.bind(torch.arange(100), None)
        st.start = 10
        st.fail("RidgeFill failed (ValueError: x)", chunk_start=chunk_start)
        return st.summary()

    first = failed_at(10)
    assert first == {"ran": False, "reason": "RidgeFill failed (ValueError: x); this chunk ran exactly"}
    later = failed_at(58)
    assert later["ran"] is False and later["filled_before_failure"] == 48
    assert later["reason"].endswith("the 48 prompt rows of earlier chunks keep their filled KV")
    assert "filled_before_failure" not in failed_at(58, arm="nofill")
    # A failure in the last chunk of a tail spanning chunks: only prefix rows [10, 92) were filled.
    assert failed_at(96)["filled_before_failure"] == 82


def test_a_failure_after_tail_rows_of_earlier_chunks_stops_the_request():
    """Tail rows of earlier chunks ran only the lower layers (their upper layers wait for the last chunk): an
    exact fallback of a later chunk would read upper-layer KV they never wrote, so the request must stop
    with an error instead of answering as if it ran exactly."""
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    def failed_at(chunk_start, arm="ridgefill"):
        st = RequestState(plan=RequestPlan(arm=arm, split=2, tail=8))
        st.bind(torch.arange(100), None)
        st.start = 10
        st.fail("RidgeFill failed (ValueError: x)", chunk_start=chunk_start)
        return st

    for chunk_start in (10, 58, 92):  # nothing of the tail ran before the failing chunk
        assert failed_at(chunk_start).stop_reason is None
    for arm in ("ridgefill", "nofill"):
        st = failed_at(96, arm)
        assert st.stop_reason == ("RidgeFill failed (ValueError: x); the 4 tail rows [92, 96) of earlier chunks "
                                  "ran only the lower layers, so no exact fallback can answer: the request stops")
        assert st.summary()["deferred_rows_lost"] == 4


def test_stopping_a_request_finishes_it_with_a_server_error():
    from http import HTTPStatus
    from types import SimpleNamespace

    from sgl_ridgefill.runtime.runtime import stop_request

    req = SimpleNamespace(to_finish=None)
    stop_request(req, "why")
    assert req.to_finish.message == "why" and req.to_finish.status_code == HTTPStatus.INTERNAL_SERVER_ERROR


def test_a_failure_on_one_tensor_parallel_rank_stops_the_server(runtime):
    """One device: the failing chunk runs exactly and the request goes on. A tensor-parallel rank cannot run
    exact layers alone (they are collectives the other ranks are not in), so it raises ``RankFailure`` out of
    the forward (SGLang's scheduler then shuts the server down) instead of leaving the others waiting."""
    import torch

    from sgl_ridgefill.runtime.distributed import RankFailure, TensorParallel
    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    fb = SimpleNamespace(rids=["a"], extend_prefix_lens_cpu=[10])
    ran_exact = []
    runtime._run_exact = lambda backend, fb, idx, hidden: ran_exact.append(idx)  # noqa: SLF001

    def state():
        st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=8))
        st.bind(torch.arange(100), None)
        st.start = 10
        return st

    st = state()
    runtime._fall_back(None, fb, 0, st, ValueError("x"), None)  # noqa: SLF001
    assert ran_exact == [[0]] and st.exact_reason.startswith("RidgeFill failed (ValueError: x)")

    runtime.tp = TensorParallel(rank=1, size=2, group=None)
    st = state()
    with pytest.raises(RankFailure, match="rank 1 of 2 for request a .*ValueError: x.* the server shuts down"):
        runtime._fall_back(None, fb, 0, st, ValueError("x"), None)  # noqa: SLF001
    assert ran_exact == [[0]] and st.exact_reason is None  # nothing ran on this rank alone


def test_a_streaming_plan_loses_no_tail_rows_to_a_failure():
    """A streaming plan's earlier tail rows ran every layer in their own chunk: the exact fallback of the
    failing chunk reads their upper-layer KV, so the request answers instead of stopping."""
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=8))
    st.bind(torch.arange(100), None)
    st.start, st.streams = 10, True
    st.fail("RidgeFill failed (ValueError: x)", chunk_start=96)
    assert st.stop_reason is None and "deferred_rows_lost" not in st.summary()


def test_an_exact_run_over_filled_cached_rows_says_ridgefill_ran():
    """Namespace mode: a request whose whole prefix the radix cache already holds runs its new rows exactly,
    but over the filled rows an earlier request of its namespace left there, so its answer is RidgeFill's:
    ``"ran": true``, with the filled rows it reused. Cached rows that are all exact leave an exact answer."""
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    def after_hit(cached, cached_exact):
        st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=8, cache_mode="namespace"))
        st.bind(torch.arange(100), None)
        st.start = cached
        st.run_exact("the radix cache already holds the whole prefix")
        st.stats.update(cached=cached, cached_exact=cached_exact)
        return st.summary()

    reused = after_hit(95, 3)
    assert reused["ran"] is True and reused["arm"] == "ridgefill" and reused["cache_mode"] == "namespace"
    assert reused["cached"] == 95 and reused["cached_exact"] == 3 and reused["reused_filled"] == 92
    assert reused["filled"] == 0 and reused["note"] == "the radix cache already holds the whole prefix"
    assert after_hit(95, 95) == {"ran": False, "reason": "the radix cache already holds the whole prefix",
                                 "cached": 95, "cached_exact": 95}


def test_an_answer_over_reused_filled_rows_is_counted(runtime):
    """Prometheus: a request that answered from filled rows of the cache is a RidgeFill request (it reports
    ``"ran": true``), counted with the filled rows it reused; an exact answer is not counted."""
    prometheus = pytest.importorskip("prometheus_client")
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    def sample(name):
        return prometheus.REGISTRY.get_sample_value(name, {"arm": "ridgefill"}) or 0.0

    def finish(rid, cached_exact):
        st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=8, cache_mode="namespace"))
        st.bind(torch.arange(100), None)
        st.start = 95
        st.run_exact("the radix cache already holds the whole prefix")
        st.stats.update(cached=95, cached_exact=cached_exact)
        runtime._finish(rid, st)  # noqa: SLF001

    requests, reused = sample("ridgefill_requests_total"), sample("ridgefill_reused_filled_rows_total")
    finish("reused", 3)
    assert sample("ridgefill_requests_total") == requests + 1
    assert sample("ridgefill_reused_filled_rows_total") == reused + 92
    finish("exact", 95)
    assert sample("ridgefill_requests_total") == requests + 1


def test_cached_rows_made_exact_are_counted(runtime):
    """Prometheus: the cached filled rows a reselecting request chose and ran exactly (``upgraded``)."""
    prometheus = pytest.importorskip("prometheus_client")
    import torch

    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.state import RequestState

    def sample(name="ridgefill_upgraded_rows_total"):
        return prometheus.REGISTRY.get_sample_value(name, {"arm": "ridgefill"}) or 0.0

    before, stored = sample(), sample("ridgefill_upgraded_stored_rows_total")
    st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=8, cache_mode="namespace", exact_every=4))
    st.bind(torch.arange(100), None)
    st.start, st.prefill_done = 95, True
    st.stats.update(cached=95, cached_exact=10, filled=0, exact=22, tail=8, upgraded=12, upgraded_stored=9,
                    saved_fraction=-2.4)
    runtime._finish("upgraded", st)  # noqa: SLF001
    assert sample() == before + 12
    assert sample("ridgefill_upgraded_stored_rows_total") == stored + 9  # their split states were kept
