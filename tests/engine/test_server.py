"""A real HTTP server on CPU: the flags, per-request control from /generate and the OpenAI API, HTTP 400
on bad parameters while the server carries on, and the namespace cache mode under chunked prefill."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
import torch

from sgl_ridgefill.cpu.environment import cpu_environment
from sgl_ridgefill.vocabulary import EXACT_CACHE_NOTE
from tests.engine.conftest import SPLIT, assert_top_close
from tests.support.engines import MEM_FRACTION, prompt
from tests.support.server import cpu_server

pytestmark = pytest.mark.engine
TAIL = 20


def test_help_lists_the_flags():
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"], env=cpu_environment(),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--prefill-backend {default,ridgefill}" in proc.stdout
    for flag in ("--ridgefill-maps", "--ridgefill-policy", "--ridgefill-split", "--ridgefill-tail",
                 "--ridgefill-cache-mode", "ridgefill_cpu"):
        assert flag in proc.stdout


@pytest.fixture(scope="module")
def server(tiny_models):
    model = tiny_models("llama")
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", str(MEM_FRACTION), "--chunked-prefill-size", "48",
            "--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir),
            "--ridgefill-split", str(SPLIT), "--ridgefill-tail", str(TAIL), "--ridgefill-cache-mode", "namespace",
            "--ridgefill-diagnostics"]
    with cpu_server(args) as url:
        yield model, url


def _generate(url, ids, ridgefill=None, *, max_new_tokens: int = 1, **extra):
    sp = {"max_new_tokens": max_new_tokens, "temperature": 0}
    if ridgefill is not None:
        sp["custom_params"] = {"ridgefill": ridgefill}
    body = {"input_ids": ids, "sampling_params": sp, "return_logprob": True, "top_logprobs_num": 3, **extra}
    return requests.post(url + "/generate", json=body, timeout=300)


def _top(resp):
    meta = resp.json()["meta_info"]
    return {"top": [[x[0], x[1]] for x in meta["output_top_logprobs"][0]], "cached": meta["cached_tokens"]}


def test_generate_matches_reference_and_bad_params_get_400(server):
    model, url = server
    ids = prompt(40, 150)
    ok = _generate(url, ids, {"arm": "identity"})
    assert ok.status_code == 200
    assert_top_close(_top(ok), model.expected_top(ids, split=SPLIT, tail=TAIL, arm="identity"))
    bad = _generate(url, ids, {"tail": -1})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == 'custom_params["ridgefill"]["tail"] must be in [1, 2147483647], got -1'
    reserved = _generate(url, ids, extra_key="x|rf:abc")
    assert reserved.status_code == 400 and "reserved" in reserved.json()["error"]["message"]
    assert requests.get(url + "/health", timeout=30).status_code == 200


def test_namespace_mode_shares_filled_kv_only_among_ridgefill(server):
    model, url = server
    ids = prompt(41, 150)
    first = _generate(url, ids, {})
    second = _generate(url, ids, {})
    # The filled prefix is reused within the namespace up to the request's own boundary, and past it the rows
    # the first request computed exactly (its tail): the second prefills only its last row, as stock would.
    assert _top(first)["cached"] == 0 and _top(second)["cached"] == 149
    assert first.json()["meta_info"]["ridgefill"]["streamed"]  # the bare fill's tail ran chunk by chunk
    summary = second.json()["meta_info"]["ridgefill"]
    assert summary["cached"] == 149 and summary["cached_exact"] == 149 - (150 - TAIL)
    # its own rows ran exactly, over the filled rows of the first: a RidgeFill answer, and it says so
    assert summary["ran"] is True and summary["reused_filled"] == 150 - TAIL and summary["filled"] == 0
    assert_top_close(_top(second), [tuple(t) for t in _top(first)["top"]], atol=1e-4)
    exact = _top(_generate(url, ids, {"enabled": False}))
    assert exact["cached"] == 0  # the exact request never sees the namespace
    assert_top_close(exact, model.expected_top(ids, split=SPLIT, tail=TAIL, arm="exact"))
    assert_top_close(_top(first), model.expected_top(ids, split=SPLIT, tail=TAIL))


def test_a_new_question_on_a_cached_document_prefills_only_its_own_tokens(server):
    """Row-exact reuse: the second question matches the document's filled rows before its boundary and the
    document rows the first request's tail computed exactly; it answers as a fresh fill of its prompt would."""
    model, url = server
    document = prompt(44, 130)
    first_ids, second_ids = document + prompt(45, 10), document + prompt(46, 10)
    assert _generate(url, first_ids, {}).status_code == 200
    watch = [5, 140 - TAIL + 2, 135]  # a filled row, an exact one of the cache, one of the new rows
    second = _generate(url, second_ids, {"watch_rows": watch})
    summary = second.json()["meta_info"]["ridgefill"]
    assert _top(second)["cached"] == 130 and summary["cached_exact"] == 130 - (140 - TAIL)
    assert summary["ran"] is True and summary["reused_filled"] == 140 - TAIL
    assert summary["watched_cached"] == 2 and summary["watched_cached_exact"] == 1
    assert_top_close(_top(second), model.expected_top(second_ids, split=SPLIT, tail=TAIL))


def _top_of(logits, k: int = 3):
    top = logits.log_softmax(-1).topk(k)
    return list(zip(top.values.tolist(), top.indices.tolist()))


def test_a_later_request_chooses_its_rows_again_and_upgrades_the_cached_ones(server):
    """A plan that chooses exact rows chooses them again over a reused cache: among the whole prefix, and the
    cached rows it chooses that the cache held filled run exactly over their own slots (split states from the
    cached lower layers). Its answer is the oracle's for that history; the next request finds them exact."""
    model, url = server
    document = prompt(47, 130)
    first_ids, second_ids = document + prompt(48, 10), document + prompt(49, 10)
    first_rows, rows = [10, 40, 70], [40, 60, 100]
    ref = model.ref
    fresh, _ = ref._fill_stage(first_ids, split=SPLIT, tail=TAIL, maps=model.maps, run_rows=first_rows, start=0,
                               cached_kv=None)  # the oracle's staged pass is the plain one on a fresh cache
    assert torch.allclose(fresh, ref.last_logits(first_ids, split=SPLIT, tail=TAIL, maps=model.maps,
                                                 exact_rows=first_rows), atol=1e-5)
    assert _generate(url, first_ids, {"exact_rows": first_rows}).status_code == 200
    second = _generate(url, second_ids, {"exact_rows": rows, "watch_rows": [5, 60, 100]})
    summary = second.json()["meta_info"]["ridgefill"]
    assert _top(second)["cached"] == 130 and summary["cached_exact"] == 3 + 130 - (140 - TAIL)
    assert summary["ran"] is True and summary["exact"] == 3 and summary["upgraded"] == 2 and summary["filled"] == 0
    # the first request chose rows too, so it kept its prefix rows' split states: no upgraded row reran 0..S-1
    assert summary["upgraded_stored"] == 2
    assert summary["watched"] == 3 and summary["watched_exact"] == 2
    expected = ref.reused_logits(first_ids, first_rows, second_ids, rows, split=SPLIT, tail=TAIL, maps=model.maps)
    assert_top_close(_top(second), _top_of(expected))
    kept = ref.reused_logits(first_ids, first_rows, second_ids, [40], split=SPLIT, tail=TAIL, maps=model.maps)
    assert abs(_top_of(kept)[0][0] - _top_of(expected)[0][0]) > 1e-4  # the upgrade changed what the tail read
    third = _generate(url, second_ids, {"exact_rows": rows}).json()["meta_info"]["ridgefill"]
    # the first's rows, the two upgraded, and both tails (but the last row, which a match never covers)
    assert third["cached"] == 139 and third["cached_exact"] == 3 + 2 + 139 - (140 - TAIL)
    assert third["upgraded"] == 0


def test_the_exact_upgrade_makes_the_document_exact_for_later_questions(server):
    """A request of a reselecting plan that decodes alone rewrites its rows exactly in its own decode steps (the
    exact upgrade, six rows a step at this chunk size): its last tokens read exact KV, as after a stock prefill,
    and a later question on the document finds every cached row exact, so it runs exactly, prefilling only its
    new tokens, and answers as stock does."""
    model, url = server
    document = prompt(60, 130)
    first_ids, second_ids = document + prompt(61, 10), document + prompt(62, 10)
    first = _generate(url, first_ids, {"exact_rows": [10, 40, 70]}, max_new_tokens=40).json()
    meta = first["meta_info"]
    assert meta["ridgefill"]["ran"] is True and meta["ridgefill"]["exact_upgrade"] == len(first_ids)
    out = first["output_ids"]
    assert len(out) == 40
    # the 40th token's step read the prompt and 39 decoded rows, all rewritten exactly by then
    last = [[x[0], x[1]] for x in meta["output_top_logprobs"][-1]]
    history = first_ids + out[:-1]
    assert_top_close({"top": last}, model.expected_top(history, split=SPLIT, tail=len(history), arm="exact"))
    filled = model.expected_top(history, split=SPLIT, tail=TAIL + 39, exact_rows=[10, 40, 70])
    assert abs(filled[0][0] - last[0][0]) > 1e-4  # without the upgrade the same step reads filled rows
    second = _generate(url, second_ids, {"exact_rows": [40, 60, 100]})
    summary = second.json()["meta_info"]["ridgefill"]
    # an answer over KV RidgeFill wrote (exact up to rounding, not bitwise stock's): "ran" stays true
    assert summary["ran"] is True and summary["note"] == EXACT_CACHE_NOTE
    assert summary["cached"] == 130 and summary["cached_exact"] == 130
    assert summary["filled"] == 0 and summary["reused_filled"] == 0
    assert_top_close(_top(second), model.expected_top(second_ids, split=SPLIT, tail=TAIL, arm="exact"))


def test_a_request_aborted_during_its_exact_upgrade_leaves_a_cache_later_questions_use(server):
    """A client aborts a request while its exact upgrade runs (after its first streamed token, with most rows
    still to rewrite): the abort ends it, what it rewrote stays usable, and a later question on the document,
    which chooses and upgrades its own rows over that cache, answers; the server serves on."""
    import json

    _, url = server
    document = prompt(63, 130)
    body = {"input_ids": document + prompt(64, 10), "stream": True, "rid": "upgrade-abort",
            "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True,
                                "custom_params": {"ridgefill": {"exact_rows": [10, 40, 70]}}}}
    with requests.post(url + "/generate", json=body, timeout=300, stream=True) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith(b"data: "))
        assert json.loads(first[len(b"data: "):])["meta_info"]["ridgefill"]["exact_upgrade"] == 140
        assert requests.post(url + "/abort_request", json={"rid": "upgrade-abort"}, timeout=60).status_code == 200
        last = [json.loads(line[len(b"data: "):]) for line in lines
                if line.startswith(b"data: ") and line != b"data: [DONE]"]
    assert last and last[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(last[-1]["output_ids"]) < 2000
    later = _generate(url, document + prompt(65, 10), {"exact_rows": [40, 60, 100]})
    assert later.status_code == 200
    summary = later.json()["meta_info"]["ridgefill"]
    assert summary["ran"] is True and summary["cached"] == 130, summary
    assert _generate(url, prompt(66, 60)).status_code == 200


def test_an_upgrade_without_kept_split_states_reruns_the_lower_layers(server):
    """A request that chose no rows keeps no split states; a later request of the same namespace that chooses
    rows then gets the split states of the cached rows it upgrades from the cached lower layers, with the same
    answer as the oracle's."""
    model, url = server
    document = prompt(57, 130)
    first_ids, second_ids = document + prompt(58, 10), document + prompt(59, 10)
    rows = [30, 60, 100]
    assert _generate(url, first_ids, {}).status_code == 200  # the bare fill: no selection, nothing kept
    summary = _generate(url, second_ids, {"exact_rows": rows}).json()["meta_info"]["ridgefill"]
    assert summary["upgraded"] == 3 and summary["upgraded_stored"] == 0
    second = _generate(url, second_ids, {"exact_rows": rows})  # the same request again: nothing left to upgrade
    assert second.json()["meta_info"]["ridgefill"]["upgraded"] == 0
    expected = model.ref.reused_logits(first_ids, [], second_ids, rows, split=SPLIT, tail=TAIL, maps=model.maps)
    assert_top_close(_top(second), _top_of(expected))


def test_a_shorter_prompt_reads_filled_rows_in_its_tail_only_within_the_slack(server):
    """C12: in namespace mode a request whose tail lies inside a longer request's filled prefix may match it
    there only for the tail's slack (its first TAIL // 8 rows); it fills its own prefix up to its boundary
    and runs the rest of its tail exactly. Its tail rows the tree already held (the longer request's filled
    rows) never become exact rows for the next request."""
    from sgl_ridgefill.runtime.exact_rows import tail_slack

    model, url = server
    ids = prompt(42, 150)
    assert _generate(url, ids, {}).status_code == 200
    slack = tail_slack(TAIL)
    for _ in range(2):
        resp = _generate(url, ids[:100], {})
        short = _top(resp)
        assert short["cached"] == 100 - TAIL + slack  # the longer request's filled rows, the slack included
        taken = resp.json()["meta_info"]["ridgefill"]["tail_reused_filled"]
        assert taken == slack
        # a tail shortened by the rows taken filled: what the oracle gives for that tail
        assert_top_close(short, model.expected_top(ids[:100], split=SPLIT, tail=TAIL - taken))


def test_every_streamed_chunk_says_what_ran(server):
    """A streamed response carries meta_info["ridgefill"] as the one summary dict, to the last chunk."""
    import json

    _, url = server
    body = {"input_ids": prompt(43, 150), "stream": True,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0, "custom_params": {"ridgefill": {}}}}
    with requests.post(url + "/generate", json=body, timeout=300, stream=True) as resp:
        assert resp.status_code == 200
        chunks = [json.loads(line[len(b"data: "):]) for line in resp.iter_lines()
                  if line.startswith(b"data: ") and line != b"data: [DONE]"]
    assert len(chunks) >= 2
    for chunk in chunks:
        meta = chunk["meta_info"]["ridgefill"]
        assert isinstance(meta, dict) and meta["ran"] and meta["tail"] == TAIL


def test_openai_client_extra_body(server):
    openai = pytest.importorskip("openai")
    model, url = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 8
    common = dict(model=str(model.path), prompt=text, max_tokens=4, temperature=0, logprobs=1)
    filled = client.completions.create(**common, extra_body={"custom_params": {"ridgefill": {"arm": "ridgefill"}}})
    exact = client.completions.create(**common, extra_body={"custom_params": {"ridgefill": {"enabled": False}}})
    assert filled.choices[0].logprobs.token_logprobs != exact.choices[0].logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError, match="arm"):
        client.completions.create(**common, extra_body={"custom_params": {"ridgefill": {"arm": "fast"}}})
