"""The soak's workload: seeded, every kind present, prompts and expectations that fit the server's shape."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.soak.workload import KINDS, LONG_DECODE_TOKENS, MAX_NEW_TOKENS, NAMESPACE_POLICY, NO_PARAMS, Shape, build_workload, count_calls

SHAPE = Shape(tail=20, chunk=48, context_length=512)


def test_a_seed_fixes_the_workload():
    a, b = build_workload(120, 7, SHAPE), build_workload(120, 7, SHAPE)
    assert a == b
    assert a != build_workload(120, 8, SHAPE)


@pytest.mark.parametrize("requests", [1, 40, 60, 300])
def test_every_kind_occurs_and_the_count_is_met(requests):
    jobs = build_workload(requests, 0, SHAPE)
    calls = count_calls(jobs)
    assert sum(calls.values()) >= requests
    assert sum(calls.values()) - requests < 4  # stops at the first job that reaches the count
    if requests >= 60:
        assert set(calls) == set(KINDS)


def test_prompts_fit_the_shape_and_decoding_is_greedy():
    jobs = build_workload(300, 1, SHAPE)
    lengths = []
    for job in jobs:
        for call in job.calls:
            body = call.body()
            json.dumps(body)  # JSON-serialisable as sent
            assert all(SHAPE.token_low <= t < SHAPE.token_high for t in call.input_ids)
            if job.kind in ("long_decode", "decode_crowd"):
                assert LONG_DECODE_TOKENS[0] <= call.max_new_tokens <= LONG_DECODE_TOKENS[1]
                assert len(call.input_ids) + call.max_new_tokens < SHAPE.context_length
            else:
                assert 1 <= call.max_new_tokens <= MAX_NEW_TOKENS
            if job.kind == "too_long":
                assert len(call.input_ids) > SHAPE.context_length and call.expect == "refused"
                continue
            assert 1 <= len(call.input_ids) <= SHAPE.longest
            lengths.append(len(call.input_ids))
            if call.expect == "ok":
                assert body["sampling_params"]["temperature"] == 0 and body["sampling_params"]["ignore_eos"]
    assert min(lengths) <= SHAPE.tail < SHAPE.chunk < max(lengths)  # short, one chunk and several chunks
    assert max(lengths) > 3 * SHAPE.chunk


def test_some_prompts_share_a_prefix_of_random_length_with_an_earlier_one():
    jobs = build_workload(300, 2, SHAPE)
    shared = [j for j in jobs if "radix_shared" in j.tags]
    assert len(shared) > 30
    seen: list[tuple[int, ...]] = []
    offsets = set()
    for job in jobs:
        ids = job.calls[0].input_ids
        if "radix_shared" in job.tags:
            offsets.add(max(_common(ids, s) for s in seen))
        seen.append(ids)
    assert len(offsets) > 10  # the shared prefix ends at many different offsets


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_expectations():
    jobs = build_workload(300, 3, SHAPE)
    for job in jobs:
        for call in job.calls:
            if job.kind in ("exact_disabled", "exact_arm", "named_plain", "prompt_logprobs") or (
                    job.kind in ("long_decode", "decode_crowd") and call.ridgefill == {"enabled": False}):
                assert call.exact is True
            if job.kind in ("bad_params", "sampling_mask", "reserved_key", "too_long"):
                assert call.expect == "refused"
            if call.expect != "ok" or job.session is not None:
                continue
            tail = call.ridgefill.get("tail", SHAPE.tail) if isinstance(call.ridgefill, dict) else SHAPE.tail
            if len(call.input_ids) <= tail:
                assert call.exact is True  # a prompt no longer than its tail always runs exactly
            if tail < SHAPE.tail < len(call.input_ids) and job.kind == "ridgefill":
                assert call.exact is None  # a shorter tail than the server's: RidgeFill may run
    sampling_mask = next(j for j in jobs if j.kind == "sampling_mask").calls[0].body()
    assert sampling_mask["return_sampling_mask"] is True and sampling_mask["sampling_params"]["temperature"] == 1.0
    plain = [j.calls[0].body() for j in jobs if j.kind == "plain"]
    assert plain and all("custom_params" not in b["sampling_params"] for b in plain)
    namespace = [j.calls[0].ridgefill for j in jobs if j.kind == "namespace"]
    assert all(NAMESPACE_POLICY in json.dumps(v) for v in namespace)


def test_rid_jobs():
    jobs = build_workload(300, 4, SHAPE)
    dup = next(j for j in jobs if j.kind == "dup_rid")
    assert dup.together and len({c.rid for c in dup.calls}) == 1 and all(c.expect == "any" for c in dup.calls)
    reuse = [j for j in jobs if j.kind == "rid_reuse"]
    assert reuse and all(len({c.rid for c in j.calls}) == 1 for j in reuse)
    assert all(j.calls[1].exact is True and j.calls[1].ridgefill != NO_PARAMS for j in reuse)
    assert {t for j in reuse for t in j.tags} >= {"reuse_after_finished"}


def test_sessions_chain_their_turns():
    jobs = build_workload(300, 5, SHAPE)
    session = next(j for j in jobs if j.kind == "session")
    bodies = list(session.bodies())
    assert 2 <= len(bodies) <= 3
    assert bodies[0]["session_params"] == {"id": session.session, "rid": None}
    for before, after in zip(bodies, bodies[1:]):
        assert after["session_params"] == {"id": session.session, "rid": before["rid"]}
    for job in (j for j in jobs if j.kind == "session"):
        # The last turn's prompt: every turn's tokens and every earlier turn's output.
        last = sum(len(c.input_ids) for c in job.calls) + MAX_NEW_TOKENS * (len(job.calls) - 1)
        assert last <= SHAPE.longest


def test_aborts():
    jobs = build_workload(300, 6, SHAPE)
    how = {j.kind: j.calls[0].abort for j in jobs if j.kind.startswith("abort_")}
    assert "later_question_abort" not in how
    assert how == {"abort_queue": "endpoint", "abort_timeout": "timeout", "abort_stream": "stream"}
    stream = next(j for j in jobs if j.kind == "abort_stream").calls[0].body()
    assert stream["stream"] is True


def test_a_shape_the_workload_cannot_use_is_refused():
    with pytest.raises(ValueError, match="tail < 6 \\* chunk < context length"):
        Shape(tail=20, chunk=48, context_length=200)
    with pytest.raises(ValueError, match="at least one request"):
        build_workload(0, 0, SHAPE)


def _document_of(job) -> int:
    """The length of the prefix every call of ``job`` shares."""
    return min(_common(job.calls[0].input_ids, c.input_ids) for c in job.calls[1:])


def test_later_questions_ask_a_cached_document_again_then_exactly():
    jobs = [j for j in build_workload(300, 9, SHAPE) if j.kind == "later_questions"]
    assert jobs
    for job in jobs:
        *asked, exact = job.calls
        assert 2 <= len(asked) <= 3 and not job.together and job.session is None
        assert all(c.ridgefill == NAMESPACE_POLICY and c.exact is None and c.expect == "ok" for c in asked)
        assert exact.ridgefill == {"enabled": False} and exact.exact is True
        # a document longer than the tail, then a question of its own each time
        assert _document_of(job) > SHAPE.tail
        assert len({c.input_ids for c in job.calls}) == len(job.calls)
        assert all(len(c.input_ids) <= SHAPE.longest for c in job.calls)
        assert "later_question" in job.tags


def test_a_later_question_is_aborted_while_it_runs_and_the_next_one_completes():
    jobs = [j for j in build_workload(300, 10, SHAPE) if j.kind == "later_question_abort"]
    assert jobs
    for job in jobs:
        first, aborted, last = job.calls
        assert aborted.abort == "endpoint" and aborted.expect == "any" and 0 <= aborted.abort_after_s <= 0.3
        assert first.abort is None is last.abort and first.expect == "ok" == last.expect
        assert all(c.ridgefill == NAMESPACE_POLICY for c in job.calls)
        assert _document_of(job) > SHAPE.tail


def test_a_decode_crowd_sends_three_long_decodes_at_once():
    jobs = [j for j in build_workload(300, 11, SHAPE) if j.kind == "decode_crowd"]
    assert jobs
    for job in jobs:
        assert job.together and len(job.calls) == 3 and len({c.rid for c in job.calls}) == 3
        # together longer than the small pools the soak runs (768 tokens) once they have decoded
        assert sum(len(c.input_ids) + c.max_new_tokens for c in job.calls) > 768
