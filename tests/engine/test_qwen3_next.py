"""Qwen3-Next (Gated DeltaNet hybrid with a sparse MoE block on every layer) through SGLang's own model class on
CPU: requests that run exactly equal transformers' Qwen3-Next, and RidgeFill equals the hybrid oracle
(``tests/support/reference.py::HybridReference``). The mechanism is Qwen3.5's; what differs is the
interleaved layout of the GDN input projections (``gdn_layout.py``), the MoE MLP and the fused gated norm.
One engine, chunked prefill at 48 rows, split 3 of 8 layers."""

from __future__ import annotations

import pytest

from sgl_ridgefill.runtime.selection import every_kth_row
from tests.engine.conftest import HYBRID_ENGINE_KWARGS, HYBRID_ENV, HYBRID_SPLIT, TERMINAL_FILE, assert_top_close
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

# Outside CI's time budget (run with -m slow): Qwen3-Next's engine (about 1.5 min);
# tests/engine/test_hybrid_matches_reference.py covers the hybrid path in CI
pytestmark = [pytest.mark.engine, pytest.mark.slow]
TAIL, N = 20, 150
POLICY = f"""policy "next-terminal" {{
  arm ridgefill
  correct terminal_state(offsets="{TERMINAL_FILE}")
}}
"""


def _plain(**kw) -> dict:
    return {"policy": "plain", "tail": TAIL, **kw}


def _scenario():
    a, b, c, d, e, f = (prompt(30 + s, N) for s in range(6))
    p = prompt(36, 100)
    pq = p + prompt(37, 60)
    rows = every_kth_row(7, 0, N - TAIL).tolist()
    return [
        ("exact", request(a, {"enabled": False}, max_new_tokens=3, top=5), dict(ids=a, arm="exact")),
        ("ridgefill", request(b, _plain(), max_new_tokens=3), dict(ids=b)),
        ("exact_rows", request(c, _plain(exact_every=7)), dict(ids=c, exact_rows=rows)),
        ("nofill", request(d, _plain(arm="nofill")), dict(ids=d, arm="nofill")),
        ("terminal", request(e), dict(ids=e, terminal_state=True)),
        ("terminal_rows", request(f, {"exact_every": 7}), dict(ids=f, exact_rows=rows, terminal_state=True)),
        ("cache_seed", request(p, {"enabled": False}), dict(ids=p, arm="exact")),
        ("cache_hit", request(pq), dict(ids=pq, start="cached", terminal_state=True)),
    ]


@pytest.fixture(scope="module")
def engine_run(tiny_hybrids, tmp_path_factory):
    model = tiny_hybrids("qwen3_next")
    policy = tmp_path_factory.mktemp("next-policy") / "next-terminal.rfpolicy"
    policy.write_text(POLICY)
    env = dict(HYBRID_ENV, RIDGEFILL_PREFILL_BACKEND="ridgefill", RIDGEFILL_DIAGNOSTICS="1",
               RIDGEFILL_MAPS=str(model.maps_dir), RIDGEFILL_POLICY=str(policy), RIDGEFILL_REQUEST_POLICIES="plain",
               RIDGEFILL_SPLIT=str(HYBRID_SPLIT), RIDGEFILL_TAIL=str(TAIL))
    cases = _scenario()
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=48, **HYBRID_ENGINE_KWARGS),
                         [step for _, step, _ in cases], env)
    return model, {name: (expect, got) for (name, _, expect), got in zip(cases, results)}


def _expected(model, expect, got, k=3, **extra):
    kw = dict(expect)
    ids = kw.pop("ids")
    kw.setdefault("tail", TAIL)
    if kw.get("start") == "cached":
        kw["start"] = got["cached_tokens"]
    kw.update(extra)
    return model.expected_top(ids, k=k, split=HYBRID_SPLIT, **kw)


@pytest.mark.parametrize("case", ["exact", "ridgefill", "exact_rows", "nofill", "terminal", "terminal_rows", "cache_seed",
                                  "cache_hit"])
def test_matches_reference(engine_run, case):
    model, by_name = engine_run
    expect, got = by_name[case]
    assert got["ridgefill"]["ran"] == (expect.get("arm") != "exact"), got["ridgefill"]
    assert_top_close(got, _expected(model, expect, got, k=len(got["top"])))


@pytest.mark.parametrize("case", ["exact", "ridgefill"])
def test_decode(engine_run, case):
    """Decode over SGLang's states equals transformers (exact) and the oracle (RidgeFill: one more tail row)."""
    model, by_name = engine_run
    expect, got = by_name[case]
    ids = list(expect["ids"])
    for step in (1, 2):
        ids.append(got["output_ids"][step - 1])
        exp = _expected(model, dict(expect, ids=list(ids)), got, k=len(got["tops"][step]), tail=TAIL + step)
        assert_top_close({"top": got["tops"][step]}, exp)


def test_radix_hit_and_correction_ran(engine_run):
    _, by_name = engine_run
    got = by_name["cache_hit"][1]
    assert got["cached_tokens"] >= 90 and 0 < got["ridgefill"]["terminal_rho"] < 1
    assert by_name["terminal"][1]["ridgefill"]["terminal_rho"] == 1.0
