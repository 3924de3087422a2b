"""RidgeFill on a Gated DeltaNet hybrid (SGLang's own Qwen3.5 model class on CPU) equals an independent
PyTorch oracle of the hybrid two-sweep method (``tests/support/reference.py::HybridReference``).

One engine (chunked prefill at 48 rows, split 3 of 8 layers: upper layers 3 and 7 attention, 4..6 GDN)
serves every scenario: the arms ridgefill, identity and nofill; exact rows (the whole prefix then passes
through the upper GDN states in the second sweep) with and without fill; the prefix/tail boundary inside a
chunk and a tail spanning chunks; a radix-cache hit (the GDN states start from the cached exact state);
the terminal-state correction on (the server's policy) and off (the shipped ``plain`` policy), with exact
rows and with a radix hit; decode over the filled states; a mixed batch; the no_insert cache mode.
"""

from __future__ import annotations

import pytest

from sgl_ridgefill.runtime.selection import every_kth_row
from tests.engine.conftest import HYBRID_ENGINE_KWARGS, HYBRID_ENV, HYBRID_SPLIT, TERMINAL_FILE, assert_top_close
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL = 20
N = 150
CHUNK = 48  # rows [96, 144) hold the prefix/tail boundary 130; tail 60 spans [90, 150) over two chunks
POLICY = f"""policy "hybrid-terminal" {{
  arm ridgefill
  correct terminal_state(offsets="{TERMINAL_FILE}")
  cache no_insert
}}
"""


def _plain(**kw) -> dict:
    """Request keys for the shipped ``plain`` policy (no correction) at this test's tail."""
    return {"policy": "plain", "tail": kw.pop("tail", TAIL), **kw}


def _scenario():
    a, b, c, d, e, f, g2, h, i2, j = (prompt(s, N) for s in range(10))
    bg, bh, bi = (prompt(s, N - 11 * s) for s in (11, 12, 13))
    short = prompt(14, 10)
    p = prompt(15, 100)
    pq, pq2 = p + prompt(16, 60), p + prompt(17, 60)
    x = prompt(18, N)
    rows = every_kth_row(7, 0, N - TAIL).tolist()
    return [
        ("ridgefill", request(a, _plain(), max_new_tokens=3), dict(ids=a)),
        ("identity", request(b, _plain(arm="identity")), dict(ids=b, arm="identity")),
        ("nofill", request(c, _plain(arm="nofill"), max_new_tokens=3), dict(ids=c, arm="nofill")),
        ("exact_rows", request(d, _plain(exact_every=7)), dict(ids=d, exact_rows=rows)),
        ("identity_rows", request(e, _plain(arm="identity", exact_every=7)), dict(ids=e, arm="identity", exact_rows=rows)),
        ("nofill_rows", request(f, _plain(arm="nofill", exact_every=7)), dict(ids=f, arm="nofill", exact_rows=rows)),
        ("long_tail", request(g2, _plain(tail=60)), dict(ids=g2, tail=60)),
        ("terminal", request(h, max_new_tokens=3), dict(ids=h, terminal_state=True)),
        ("terminal_rows", request(i2, {"exact_every": 7}), dict(ids=i2, exact_rows=rows, terminal_state=True)),
        ("terminal_long_tail", request(j, {"tail": 60}), dict(ids=j, tail=60, terminal_state=True)),
        ("terminal_off", request(h, _plain()), dict(ids=h)),
        ("batch", [request(bg, _plain()), request(bh, {"enabled": False}), request(bi, _plain(arm="identity"))],
         [dict(ids=bg), dict(ids=bh, arm="exact"), dict(ids=bi, arm="identity")]),
        ("short_prompt", request(short), dict(ids=short, arm="exact")),
        ("cache_seed", request(p, {"enabled": False}), dict(ids=p, arm="exact")),
        ("cache_hit", request(pq, _plain()), dict(ids=pq, start="cached")),
        ("cache_hit_terminal", request(pq2), dict(ids=pq2, start="cached", terminal_state=True)),
        ("bad_param", request(a, {"arm": "bogus"}), dict(error="arm")),
        ("no_insert_rf", request(x, _plain()), dict(ids=x)),
        ("no_insert_exact", request(x, {"enabled": False}), dict(ids=x, arm="exact")),
    ]


@pytest.fixture(scope="module")
def engine_run(tiny_hybrid, tmp_path_factory):
    model = tiny_hybrid
    policy = tmp_path_factory.mktemp("hybrid-policy") / "hybrid-terminal.rfpolicy"
    policy.write_text(POLICY)
    cases = _scenario()
    env = dict(
        HYBRID_ENV,
        RIDGEFILL_PREFILL_BACKEND="ridgefill",
        RIDGEFILL_DIAGNOSTICS="1",
        RIDGEFILL_MAPS=str(model.maps_dir),
        RIDGEFILL_POLICY=str(policy),
        RIDGEFILL_REQUEST_POLICIES="plain",
        RIDGEFILL_SPLIT=str(HYBRID_SPLIT),
        RIDGEFILL_TAIL=str(TAIL),
    )
    steps = [step for _, step, _ in cases]
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=CHUNK, **HYBRID_ENGINE_KWARGS), steps, env)
    flat = []
    for name, step, expect in cases:
        if isinstance(step, list):
            flat.extend((f"{name}[{k}]", ex) for k, ex in enumerate(expect))
        else:
            flat.append((name, expect))
    assert len(results) == len(flat)
    return model, {name: (expect, got) for (name, expect), got in zip(flat, results)}


def _expected(model, expect: dict, got: dict, **extra):
    kw = dict(expect)
    ids = kw.pop("ids")
    kw.setdefault("tail", TAIL)
    if kw.get("start") == "cached":
        kw["start"] = got["cached_tokens"]
    kw.update(extra)
    return model.expected_top(ids, split=HYBRID_SPLIT, **kw)


CASES = ["ridgefill", "identity", "nofill", "exact_rows", "identity_rows", "nofill_rows", "long_tail", "terminal",
         "terminal_rows", "terminal_long_tail", "terminal_off", "batch[0]", "batch[1]", "batch[2]", "short_prompt",
         "cache_seed", "cache_hit", "cache_hit_terminal", "no_insert_rf", "no_insert_exact"]


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(engine_run, case):
    model, by_name = engine_run
    expect, got = by_name[case]
    assert_top_close(got, _expected(model, expect, got))


@pytest.mark.parametrize("case", ["ridgefill", "nofill", "terminal"])
def test_decode_continues_the_filled_states(engine_run, case):
    """Decode steps run the full model from the states the prefill left (nofill: without the filled rows);
    to the oracle a decoded token is one more tail row."""
    model, by_name = engine_run
    expect, got = by_name[case]
    ids = list(expect["ids"])
    for step in (1, 2):
        ids.append(got["output_ids"][step - 1])
        exp = _expected(model, dict(expect, ids=list(ids)), got, tail=TAIL + step)
        assert_top_close({"top": got["tops"][step]}, exp)


def test_radix_hit_starts_from_the_cached_state(engine_run):
    model, by_name = engine_run
    for case in ("cache_hit", "cache_hit_terminal"):
        _, got = by_name[case]
        assert got["cached_tokens"] >= 90, got["cached_tokens"]  # the exact request's prompt (100 tokens)
        assert got["ridgefill"]["cached"] == got["cached_tokens"]


def test_fill_and_correction_change_the_output(engine_run):
    """Guards the comparisons against passing trivially: the fill differs from exact and from identity, and
    the correction moves the output."""
    model, by_name = engine_run
    ids = by_name["ridgefill"][0]["ids"]
    got = by_name["ridgefill"][1]["top"]
    exact = _expected(model, dict(ids=ids, arm="exact"), {})
    identity = _expected(model, dict(ids=ids, arm="identity"), {})
    assert abs(got[0][0] - exact[0][0]) > 1e-3 and abs(got[0][0] - identity[0][0]) > 1e-3
    on, off = by_name["terminal"][1]["top"], by_name["terminal_off"][1]["top"]
    assert abs(on[0][0] - off[0][0]) > 1e-3


def test_terminal_share_is_reported(engine_run):
    """ρ is 1 when every new prefix row is filled; below 1 with exact rows or a cached prefix."""
    _, by_name = engine_run
    assert by_name["terminal"][1]["ridgefill"]["terminal_rho"] == 1.0
    assert 0 < by_name["terminal_rows"][1]["ridgefill"]["terminal_rho"] < 1
    assert 0 < by_name["cache_hit_terminal"][1]["ridgefill"]["terminal_rho"] < 1
    assert "terminal_rho" not in by_name["terminal_off"][1]["ridgefill"]


def test_filled_states_never_reach_an_exact_request(engine_run):
    _, by_name = engine_run
    assert by_name["no_insert_exact"][1]["cached_tokens"] == 0


def test_bad_parameter_fails_that_request_only(engine_run):
    _, by_name = engine_run
    _, got = by_name["bad_param"]
    assert "error" in got and "bogus" in got["error"]


def test_every_response_says_what_ran(engine_run):
    _, by_name = engine_run
    meta = {name: got["ridgefill"] for name, (_, got) in by_name.items() if "error" not in got}
    rows = len(every_kth_row(7, 0, N - TAIL))
    assert meta["ridgefill"]["ran"] and meta["ridgefill"]["filled"] == N - TAIL
    assert meta["exact_rows"]["exact"] == rows and meta["exact_rows"]["filled"] == N - TAIL - rows
    assert meta["nofill"]["filled"] == 0
    assert meta["batch[1]"] == {"ran": False, "reason": "the request asked for exact prefill"}
