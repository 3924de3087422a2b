"""The soak's verdicts on synthetic outcomes: expectations per call, the exact comparisons, the failure counts."""

from __future__ import annotations

import math

from sgl_ridgefill.soak import compare as C
from sgl_ridgefill.soak.client import Outcome
from sgl_ridgefill.soak.summary import FAILURE_KEYS, REUSE_JUDGED_FROM, REUSE_POOL_TOKENS, exit_status, failures, reuse, tally, unexpected
from sgl_ridgefill.soak.workload import Call, Job


def _response(ids, logprobs, ran=False, finish="length", prompt_logprobs=()):
    meta = {"finish_reason": {"type": finish}, "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)],
            "input_token_logprobs": [[lp, 0, None] for lp in prompt_logprobs],
            "ridgefill": {"ran": True, "arm": "ridgefill"} if ran else {"ran": False, "reason": "the request asked for exact prefill"}}
    return {"output_ids": list(ids), "meta_info": meta}


def _ok(job, call=0, ids=(5, 6), logprobs=(-1.0, -2.0), **kw):
    return Outcome(job, call, "k", status=200, response=_response(ids, logprobs, **kw), prompt=(1, 2, 3))


CALL = Call((1, 2, 3), 2, {"enabled": False}, exact=True)


def test_what_each_call_may_get():
    job = Job(0, "k", (CALL, Call((1,), 1, {"tail": -1}, expect="refused"), Call((1,), 1, expect="any", abort="stream")))
    assert unexpected(job, _ok(0)) is None
    assert "complete answer" in unexpected(job, Outcome(0, 0, "k", status=400, error="bad"))
    assert "complete answer" in unexpected(job, _ok(0, finish="abort"))
    assert unexpected(job, Outcome(0, 1, "k", status=400)) is None
    assert "refusal" in unexpected(job, _ok(0, 1))
    assert unexpected(job, Outcome(0, 2, "k", status=200, error="closed_after_first_chunk")) is None
    assert unexpected(job, Outcome(0, 2, "k", error="timeout")) is None
    assert "went away" in unexpected(job, Outcome(0, 2, "k", error="connection"))
    assert unexpected(job, Outcome(0, 0, "k", status=500)) is None  # counted as a 5xx, not twice


def test_tally_counts_statuses_kinds_and_5xx():
    job = Job(0, "k", (CALL, CALL))
    out = tally([job], [_ok(0), Outcome(0, 1, "k", status=503)])
    assert out["requests"]["sent"] == 2 and out["requests"]["by_kind"] == {"k": 2}
    assert out["responses"]["by_status"] == {"200": 1, "503": 1} and out["responses"]["5xx"] == 1
    assert out["responses"]["ridgefill_ran"] == {"true": 0, "false": 1}


def test_tally_counts_prefills_in_short_forwards():
    job = Job(0, "k", (CALL, CALL, CALL))
    metas = [{"ran": True, "slices": 3, "yields": 4}, {"ran": True, "yields": 2}, {"ran": True}]
    outcomes = [Outcome(0, j, "k", status=200, response={"meta_info": {"ridgefill": m}}) for j, m in enumerate(metas)]
    cut = tally([job], outcomes)["responses"]["ridgefill_short_forwards"]
    assert cut == {"requests": 2, "sliced": 1, "yields": 6}


def test_tally_counts_exact_upgrades_and_questions_over_upgraded_documents():
    job = Job(0, "k", (CALL, CALL, CALL))
    metas = [{"ran": True, "exact_upgrade": 140}, {"ran": True, "note": "the radix cache holds the whole prefix exact"},
             {"ran": True}]
    outcomes = [Outcome(0, j, "k", status=200, response={"meta_info": {"ridgefill": m}}) for j, m in enumerate(metas)]
    up = tally([job], outcomes)["responses"]["ridgefill_exact_upgrade"]
    assert up == {"planned": 1, "planned_rows": 140, "over_exact_cache": 1}


def test_exact_cases_and_what_must_run_exactly():
    job = Job(0, "k", (CALL, Call((1, 2, 3), 2, {}), Call((1, 2, 3), 2, {})))
    outcomes = [_ok(0, 0, ran=True), _ok(0, 1), _ok(0, 2, ran=True)]
    outcomes.append(Outcome(0, 1, "k", status=200, response={"output_ids": [1], "meta_info": {
        "finish_reason": {"type": "length"}, "ridgefill": [{"ran": False, "reason": "r"}]}}))
    cases, failing = C.exact_cases([job], outcomes)
    assert [(c.job, c.call) for c in cases] == [(0, 1)]
    assert cases[0].body == {"input_ids": [1, 2, 3], "return_logprob": True,
                             "sampling_params": {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True}}
    assert cases[0].ridgefill_body["sampling_params"]["custom_params"] == {"ridgefill": {}}
    assert C.forced_exact(cases[0].body)["sampling_params"]["custom_params"] == {"ridgefill": {"enabled": False}}
    assert len(failing) == 2 and "had to run exactly" in failing[0] and "not {" in failing[1]


def test_difference():
    a = C.Answer((1, 2), (-1.0, -2.0))
    assert C.difference(a, a) == 0.0
    assert C.difference(a, C.Answer((1, 2), (-1.0, -2.5))) == 0.5
    assert math.isinf(C.difference(a, C.Answer((1, 3), (-1.0, -2.0))))
    assert math.isinf(C.difference(C.Answer((1,), (-1.0,), (None, -3.0)), C.Answer((1,), (-1.0,), (None,))))


def _case(i, logprobs):
    return C.ExactCase(i, 0, "k", "r", {"input_ids": [1, 2]}, {"input_ids": [1, 2]}, C.Answer((5, 6), logprobs))


def test_compare_is_bitwise_sequentially_and_within_the_stock_spread_concurrently():
    stock_seq = [_ok(i) for i in range(3)]
    stock_conc = [_ok(0, logprobs=(-1.0, -2.0 + 1e-5)), _ok(1), _ok(2)]  # stock differs from itself by 1e-5
    rf_seq = [_ok(0), _ok(1), _ok(2, logprobs=(-1.0, -2.0 + 1e-7))]  # one last-bit difference: a mismatch
    cases = [_case(0, (-1.0, -2.0 + 3e-5)), _case(1, (-1.0, -2.0)), _case(2, (-1.0, -1.5))]
    out = C.compare(cases, rf_seq, stock_seq, stock_conc)
    assert out["stock_vs_stock"]["max_abs_logprob_diff"] == 1e-5 or math.isclose(out["stock_vs_stock"]["max_abs_logprob_diff"], 1e-5)
    assert math.isclose(out["concurrent"]["tolerance"], C.TOLERANCE_FACTOR * 1e-5)
    assert out["sequential"]["mismatches"] == 1 and out["sequential"]["first"][0]["request"].startswith("job 2")
    assert out["concurrent"]["mismatches"] == 1 and out["concurrent"]["first"][0]["max_abs_diff"] == 0.5
    assert out["mismatches"] == 2


def test_failures_and_exit_status():
    summary = {"exact": {"mismatches": 0, "not_exact": 0}, "responses": {"5xx": 0, "unexpected": 0},
               "fuzz": {"server_errors": 0, "failures": 0},
               "server": {"crashes": 0, "live_requests": 0.0, "final_request_ok": True},
               "reuse": {"ran": REUSE_JUDGED_FROM, "reused": 1}}
    summary["failures"] = failures(summary)
    assert tuple(summary["failures"]) == FAILURE_KEYS  # the keys the engine soak test expects, in order
    assert not any(summary["failures"].values()) and exit_status(summary) == 0
    for path, value, key in ((("server", "live_requests"), 2.0, "leaked_states"),
                             (("server", "live_requests"), None, "leaked_states"),
                             (("fuzz", "server_errors"), 1, "5xx"), (("server", "crashes"), 1, "crashes"),
                             (("exact", "not_exact"), 3, "exact_not_exact"),
                             (("server", "final_request_ok"), False, "unexpected_outcomes"),
                             (("reuse", "reused"), 0, "reuse_missing")):
        broken = {k: dict(v) for k, v in summary.items() if k != "failures"}
        broken[path[0]][path[1]] = value
        broken["failures"] = failures(broken)
        assert broken["failures"][key] >= 1 and exit_status(broken) == 1, (path, value)


def _later(job, call, **ridgefill):
    out = _ok(job, call, ran=True)
    out.response["meta_info"]["ridgefill"].update(ridgefill)
    return out


def test_reuse_counts_the_later_questions_and_their_upgrades():
    ask = Call((1, 2, 3), 2, "soak-namespace")
    later = Job(0, "later_questions", (ask, ask, ask, CALL), tags=frozenset({"later_question"}))
    other = Job(1, "namespace", (ask, ask))
    outcomes = [
        _later(0, 0, cached=0),  # the first question fills the document: not a later one
        _later(0, 1, cached=40, cached_exact=12, upgraded=3),
        _later(0, 2, cached=40, cached_exact=15, upgraded=0),
        _ok(0, 3),  # the exact question: compared with stock, not counted here
        _later(1, 1, cached=40, upgraded=9),  # not a later-question job
    ]
    assert reuse([later, other], outcomes) == {
        "later_questions": 2, "ran": 2, "reused": 2, "cached_rows": 80, "cached_exact_rows": 27, "upgraded": 1,
        "upgraded_rows": 3,
    }
    aborted = Outcome(0, 1, "later_questions", status=200, response=_response((5,), (-1.0,), ran=True, finish="abort"))
    assert reuse([later], [aborted])["later_questions"] == 0  # only complete answers count


def test_reuse_is_judged_only_where_the_pool_can_keep_a_document():
    summary = {"reuse": {"ran": REUSE_JUDGED_FROM, "reused": 0}}
    for tokens, judged in ((None, True), (REUSE_POOL_TOKENS, True), (16384, True), (768, False)):
        summary["pool"] = {"tokens": tokens}
        assert failures(summary)["reuse_missing"] == int(judged), tokens
    summary["reuse"] = {"ran": REUSE_JUDGED_FROM - 1, "reused": 0}
    summary["pool"] = {"tokens": 16384}
    assert failures(summary)["reuse_missing"] == 0  # too few later questions to judge
