"""RidgeFill in a real SGLang engine on CPU equals an independent PyTorch oracle (``tests/support/reference.py``).

Covers the arms, exact rows, value rescale, chunked prefill with the prefix/tail boundary inside a chunk and
a tail spanning chunks (results equal across chunk sizes), several requests per batch with RidgeFill and exact
mixed, prompts shorter than the tail, a radix-cache hit over part of the prompt, the random-rows control, a
bad request that leaves the engine serving, and determinism.
"""

from __future__ import annotations

import pytest

from sgl_ridgefill.runtime.selection import every_kth_row
from sgl_ridgefill.selectors.registry import random_rows
from tests.engine.conftest import SPLIT, assert_decode_matches, assert_top_close
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL = 20
N = 150
PLAIN = {"policy": "plain", "split": SPLIT, "tail": TAIL}  # the bare fill in cache mode no_insert
WATCH = [3, 6, 8, 13, 15, 16, N - 1]  # watched by the exact_rows case: two of its every-7th rows, four filled, one in the tail


def _scenario():
    """(name, steps-or-step, expectation kwargs per request)."""
    a, b, c, d, e, f = (prompt(s, N) for s in range(6))
    g, h, i = (prompt(s, N - 11 * s) for s in (6, 7, 8))
    short = prompt(9, 10)
    p = prompt(10, 100)
    pq = p + prompt(11, 60)
    r = prompt(12, N)
    x = prompt(13, N)
    y = prompt(14, N)
    cases = [
        ("ridgefill", request(a, max_new_tokens=3), dict(ids=a)),
        ("identity", request(b, {"arm": "identity"}), dict(ids=b, arm="identity")),
        ("nofill", request(c, {"arm": "nofill"}, max_new_tokens=3), dict(ids=c, arm="nofill")),
        ("exact_rows", request(d, {"exact_every": 7, "watch_rows": WATCH}), dict(ids=d, exact_rows=every_kth_row(7, 0, N - TAIL).tolist())),
        ("given_rows", request(y, {"exact_rows": [40, 3, 77, 129, 129, 140]}), dict(ids=y, exact_rows=[3, 40, 77, 129])),
        ("value_rescale", request(e, {"value_rescale": 8}), dict(ids=e, value_rescale=8)),
        ("long_tail", request(f, {"tail": 60}), dict(ids=f, tail=60)),
        ("batch", [request(g), request(h, {"enabled": False}), request(i, {"arm": "identity"})],
         [dict(ids=g), dict(ids=h, arm="exact"), dict(ids=i, arm="identity")]),
        ("short_prompt", request(short), dict(ids=short, arm="exact")),
        ("cache_seed", request(p, {"enabled": False}), dict(ids=p, arm="exact")),
        # A request naming the plain policy runs no_insert, which reuses the exact cached prefix.
        ("cache_hit", request(pq, PLAIN), dict(ids=pq, start="cached")),
        ("bad_param", request(a, {"arm": "bogus"}), dict(error="arm")),
        ("random_rows", request(r, {"exact_every": 7, "control": "random", "seed": 3}),
         dict(ids=r, exact_rows=random_rows(len(every_kth_row(7, 0, N - TAIL)), N - TAIL, 3).tolist())),
        ("repeat", request(a, PLAIN), dict(ids=a)),  # no_insert: recomputed, bit-equal to the first
        ("shared_rf", request(x), dict(ids=x)),  # the default cache mode (auto) shares this fill in its namespace
        ("exact_after_rf", request(x, {"enabled": False}), dict(ids=x, arm="exact")),
        ("shared_repeat", request(x), dict(ids=x)),
    ]
    return cases


# CI runs llama at chunk 37 and qwen2 at 48; the unchunked llama run and qwen3 (also in test_map_kinds) with -m slow.
@pytest.fixture(scope="module", params=["llama-37", pytest.param("llama-512", marks=pytest.mark.slow), "qwen2-48",
                                        pytest.param("qwen3-64", marks=pytest.mark.slow)])
def engine_run(request, tiny_models):
    family, chunk = request.param.split("-")
    model = tiny_models(family)
    cases = _scenario()
    steps = [step for _, step, _ in cases]
    env = {
        "RIDGEFILL_PREFILL_BACKEND": "ridgefill",
        "RIDGEFILL_DIAGNOSTICS": "1",
        "RIDGEFILL_MAPS": str(model.maps_dir),
        "RIDGEFILL_SPLIT": str(SPLIT),
        "RIDGEFILL_TAIL": str(TAIL),
    }
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=int(chunk)), steps, env)
    flat = []
    for name, step, expect in cases:
        if isinstance(step, list):
            flat.extend((f"{name}[{j}]", e) for j, e in enumerate(expect))
        else:
            flat.append((name, expect))
    assert len(results) == len(flat)
    return model, dict(zip([n for n, _ in flat], zip([e for _, e in flat], results)))


CASES = ["ridgefill", "identity", "nofill", "exact_rows", "given_rows", "value_rescale", "long_tail", "batch[0]", "batch[1]",
         "batch[2]", "short_prompt", "cache_seed", "random_rows", "repeat", "shared_rf", "exact_after_rf", "shared_repeat"]


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(engine_run, case):
    model, by_name = engine_run
    expect, got = by_name[case]
    kw = dict(expect)
    ids = kw.pop("ids")
    kw.setdefault("tail", TAIL)
    assert_top_close(got, model.expected_top(ids, split=SPLIT, **kw))


@pytest.mark.parametrize("case", ["ridgefill", "nofill"])
def test_decode_reads_the_filled_cache(engine_run, case):
    """Decode steps run the full model over the filled cache (nofill: without the filled rows)."""
    model, by_name = engine_run
    expect, got = by_name[case]
    assert_decode_matches(model, expect, got, tail=TAIL)


def test_radix_hit_reuses_exact_prefix(engine_run):
    model, by_name = engine_run
    expect, got = by_name["cache_hit"]
    assert got["cached_tokens"] >= 90  # the exact request's prompt (100 tokens) is in the tree
    assert_top_close(got, model.expected_top(expect["ids"], split=SPLIT, tail=TAIL, start=got["cached_tokens"]))


def test_ridgefill_differs_from_exact_and_identity(engine_run):
    """Guards the oracle comparisons against passing trivially."""
    model, by_name = engine_run
    _, got = by_name["ridgefill"]
    ids = by_name["ridgefill"][0]["ids"]
    exact = model.expected_top(ids, split=SPLIT, tail=TAIL, arm="exact")
    identity = model.expected_top(ids, split=SPLIT, tail=TAIL, arm="identity")
    assert abs(got["top"][0][0] - exact[0][0]) > 1e-3
    assert abs(got["top"][0][0] - identity[0][0]) > 1e-3


def test_filled_kv_never_reaches_an_exact_request(engine_run):
    """A RidgeFill request's KV enters the radix cache only under its namespace (the default ``auto`` mode,
    for a plan without exact rows), so the exact request after it on the same prompt finds no cached rows and
    computes everything itself."""
    _, by_name = engine_run
    assert by_name["shared_rf"][1]["ridgefill"]["cache_mode"] == "namespace"
    assert by_name["exact_after_rf"][1]["cached_tokens"] == 0


def test_auto_shares_a_fill_with_the_next_request_of_the_same_plan(engine_run):
    """``auto``: the same prompt asked again with the same plan reuses the first request's rows (its filled
    prefix and its exact tail), and answers as a fresh fill (``test_matches_reference[shared_repeat]``); so does
    a plan with exact rows that it chooses again over a reused cache (``test_server.py`` follows one into a
    cached document); the plain policy keeps its KV to itself."""
    _, by_name = engine_run
    again = by_name["shared_repeat"][1]
    assert again["ridgefill"]["cache_mode"] == "namespace" and again["cached_tokens"] >= N - TAIL
    assert by_name["repeat"][1]["cached_tokens"] == 0
    assert by_name["exact_rows"][1]["ridgefill"]["cache_mode"] == "namespace"
    assert by_name["cache_hit"][1]["ridgefill"]["cache_mode"] == "no_insert"


def test_bad_parameter_fails_that_request_only(engine_run):
    _, by_name = engine_run
    _, got = by_name["bad_param"]
    assert "error" in got and "arm" in got["error"] and "bogus" in got["error"]
    assert by_name["repeat"][1]["top"] == by_name["ridgefill"][1]["top"]  # served after the error, deterministic


def test_every_response_says_what_ran(engine_run):
    """meta_info["ridgefill"]: what ran, with its row counts, or why the request ran exactly."""
    _, by_name = engine_run
    meta = {name: got["ridgefill"] for name, (_, got) in by_name.items() if "error" not in got}
    exact_rows = len(every_kth_row(7, 0, N - TAIL))
    assert meta["ridgefill"]["ran"] and meta["ridgefill"]["arm"] == "ridgefill"
    assert (meta["ridgefill"]["prompt"], meta["ridgefill"]["tail"], meta["ridgefill"]["exact"]) == (N, TAIL, 0)
    assert meta["ridgefill"]["filled"] == N - TAIL
    assert meta["exact_rows"]["exact"] == exact_rows and meta["exact_rows"]["filled"] == N - TAIL - exact_rows
    # watch_rows reports the watched rows of the filled prefix and those that ran exactly; the tail row is not counted
    in_prefix = [p for p in WATCH if p < N - TAIL]
    chosen = set(every_kth_row(7, 0, N - TAIL).tolist()) | {0}  # position 0, the sink, always runs exactly
    assert (meta["exact_rows"]["watched"], meta["exact_rows"]["watched_exact"]) == (
        len(in_prefix), sum(p in chosen for p in in_prefix))
    assert 0 < meta["exact_rows"]["watched_exact"] < meta["exact_rows"]["watched"]
    assert "watched" not in meta["ridgefill"]
    assert meta["identity"]["arm"] == "identity" and meta["nofill"]["filled"] == 0
    assert meta["batch[1]"] == {"ran": False, "reason": "the request asked for exact prefill"}
    assert meta["short_prompt"] == {"ran": False, "reason": f"the prompt (10 tokens) is not longer than the tail ({TAIL})"}
    assert meta["cache_hit"]["ran"] and meta["cache_hit"]["cached"] == by_name["cache_hit"][1]["cached_tokens"]
