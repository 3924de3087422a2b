"""The reliability findings that need a real server: one request, however odd,
must neither stop the scheduler nor be served filled KV it did not ask for.

One CPU server runs them all: RidgeFill in namespace mode with an attention-selecting server policy,
diagnostics on, sessions (streaming too), scheduler-side truncation and a small chunk. Each test names its
finding; every test ends with the server healthy.
"""

from __future__ import annotations

import pytest
import requests

from tests.engine.conftest import SPLIT, assert_top_close
from tests.support.engines import MEM_FRACTION, prompt
from tests.support.server import cpu_server

pytestmark = pytest.mark.engine
TAIL, MAX_TOTAL = 20, 2048
POLICY = f"""
policy "findings" {{
  arm ridgefill
  split {SPLIT}
  tail {TAIL}
  cache namespace
  select attention_topk(q=64, share=10%, layers=[0, 1], query="before_tail")
}}
"""


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    policy = tmp_path_factory.mktemp("findings") / "findings.rfpolicy"
    policy.write_text(POLICY)
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", str(MAX_TOTAL),
            "--mem-fraction-static", str(MEM_FRACTION), "--chunked-prefill-size", "48", "--allow-auto-truncate",
            "--enable-streaming-session", "--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir),
            "--ridgefill-policy", str(policy), "--ridgefill-diagnostics"]
    with cpu_server(args) as url:
        yield model, url


def _post(url, path, body):
    return requests.post(url + path, json=body, timeout=300)


def _generate(url, ids, ridgefill=None, *, new=1, temperature=0.0, **extra):
    sp = {"max_new_tokens": new, "temperature": temperature}
    if ridgefill is not None:
        sp["custom_params"] = {"ridgefill": ridgefill}
    return _post(url, "/generate", {"input_ids": ids, "sampling_params": sp, "return_logprob": True,
                                    "top_logprobs_num": 3, **extra})


def _top(resp):
    assert resp.status_code == 200, resp.text
    meta = resp.json()["meta_info"]
    return {"top": [[x[0], x[1]] for x in meta["output_top_logprobs"][0]], "cached": meta["cached_tokens"],
            "ids": resp.json()["output_ids"], "ridgefill": meta.get("ridgefill"), "prompt": meta["prompt_tokens"]}


def _healthy(url):
    assert requests.get(url + "/health", timeout=60).status_code == 200


def test_exact_every_beyond_the_new_prefix(server):
    """C2: exact_every larger than the new prefix raised inside the forward and stopped the scheduler."""
    model, url = server
    ids = prompt(90, 150)
    got = _top(_generate(url, ids, {"exact_every": 10**6}))
    assert got["ridgefill"]["ran"] and got["ridgefill"]["exact"] == 0
    assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL))
    short = prompt(91, TAIL + 3)
    assert _generate(url, short, {"exact_every": 8}).status_code == 200
    _healthy(url)


def test_a_session_turn_is_planned_from_history_and_turn(server):
    """C3: a session continuation was planned from the new turn alone and overflowed the tail buffer."""
    model, url = server
    sid = _post(url, "/open_session", {"capacity_of_str_len": 100000}).json()
    turn1 = prompt(92, 30)
    first = _generate(url, turn1, {"policy": "plain", "tail": TAIL}, rid="turn-1", session_params={"id": sid})
    assert first.status_code == 200, first.text
    turn2 = prompt(93, 200)
    second = _top(_generate(url, turn2, {"policy": "plain", "tail": TAIL}, session_params={"id": sid, "rid": "turn-1"}))
    history = turn1 + first.json()["output_ids"]
    assert second["prompt"] == len(history) + len(turn2)
    assert second["ridgefill"]["ran"] and second["ridgefill"]["prompt"] == second["prompt"]
    _post(url, "/close_session", {"session_id": sid})
    _healthy(url)


def test_truncated_prompts_run_what_the_scheduler_keeps(server):
    """C4: scheduler-side truncation left RidgeFill planning the untruncated prompt: silent garbage."""
    model, url = server
    ids = prompt(94, MAX_TOTAL + 300)
    got = _top(_generate(url, ids, {"policy": "plain", "tail": TAIL}))
    kept = ids[: got["prompt"]]
    assert got["prompt"] < len(ids)
    assert got["ridgefill"]["ran"] and got["ridgefill"]["prompt"] == len(kept)
    assert_top_close(got, model.expected_top(kept, split=SPLIT, tail=TAIL))
    _healthy(url)


def test_selection_after_a_radix_hit_inside_its_query_window(server):
    """C5: attention selection read queries the radix cache held (their lower layers never ran): here a
    namespace prompt grows between turns, so its question-blind window (the 64 rows before the tail)
    starts inside the prefix the first turn cached."""
    _, url = server
    p = prompt(95, 150)
    assert _top(_generate(url, p))["ridgefill"]["ran"]  # inserts P into its namespace
    got = _top(_generate(url, p + prompt(96, 25)))
    assert got["cached"] > 175 - TAIL - 64  # the hit reaches into the query window
    assert got["ridgefill"]["ran"]
    _healthy(url)


def test_nofill_never_shares_its_cache(server):
    """C6: nofill in namespace mode inserted upper layers that hold nothing, read by the next nofill request."""
    _, url = server
    ids = prompt(97, 150)
    first = _top(_generate(url, ids, {"arm": "nofill", "policy": "plain", "tail": TAIL}))
    second = _top(_generate(url, ids, {"arm": "nofill", "policy": "plain", "tail": TAIL}))
    assert first["ridgefill"]["cache_mode"] == "no_insert" and second["cached"] == 0
    assert first["top"] == second["top"]
    _healthy(url)


def test_streaming_sessions_run_exact(server):
    """C9: a streaming session kept a RidgeFill turn's filled KV for the next, exact turn."""
    model, url = server
    sid = _post(url, "/open_session", {"capacity_of_str_len": 100000, "streaming": True}).json()
    turn1 = prompt(98, 60)
    first = _top(_generate(url, turn1, {"policy": "plain", "tail": TAIL}, session_params={"id": sid}))
    assert first["ridgefill"] == {"ran": False, "reason": first["ridgefill"]["reason"]}
    assert "streaming" in first["ridgefill"]["reason"]
    assert_top_close(first, model.expected_top(turn1, split=SPLIT, tail=TAIL, arm="exact"))
    _post(url, "/close_session", {"session_id": sid})
    _healthy(url)


def test_a_rejected_request_leaves_nothing_for_its_rid(server):
    """C1: a request SGLang rejects after creating it left its state under its rid; the next request with
    that rid ran on the old plan and inserted mixed KV into the exact tree."""
    model, url = server
    a, b = prompt(99, 150), prompt(100, 120)
    rejected = _generate(url, a, {"policy": "plain", "tail": TAIL}, rid="reused",
                         return_sampling_mask=True, temperature=1.0)  # SGLang refuses it (top_k not 1)
    assert rejected.status_code == 400
    exact = _top(_generate(url, b, {"enabled": False}, rid="reused"))
    assert exact["ridgefill"] == {"ran": False, "reason": "the request asked for exact prefill"}
    assert_top_close(exact, model.expected_top(b, split=SPLIT, tail=TAIL, arm="exact"))
    again = _top(_generate(url, b, {"enabled": False}))  # reads what the first one inserted: exact KV
    assert again["cached"] > 0
    assert_top_close(again, model.expected_top(b, split=SPLIT, tail=TAIL, arm="exact"))
    _healthy(url)


def test_a_namespace_mark_in_the_cache_key_is_refused(server):
    """C10: a client naming RidgeFill's namespace could read filled KV or insert exact KV into it."""
    _, url = server
    for extra in ({"extra_key": "x|rf:rf:00"}, {"cache_salt": "x|rf:rf:00"}):
        resp = _generate(url, prompt(101, 40), **extra)
        assert resp.status_code == 400 and "reserved" in resp.json()["error"]["message"]
    _healthy(url)
