"""Sink rows on a Gated DeltaNet hybrid: maps fitted without the sink rows run them exactly, so the upper GDN
states take the whole prefix in position order in the second sweep (sinks exact among filled rows), and the
result equals the hybrid oracle with those rows exact. The sink rule here flags position 0 only (a norm
ratio no row reaches), across chunks of 48 rows, with and without a selection, and after a radix-cache hit
(the cached rows hold no sink to run).
"""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.runtime.selection import every_kth_row
from tests.engine.conftest import HYBRID_ENGINE_KWARGS, HYBRID_ENV, HYBRID_SPLIT, assert_top_close, random_maps
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

# Outside CI's time budget (run with -m slow): about 1.5 min; the hybrid fill runs in CI in
# test_hybrid_matches_reference
pytestmark = [pytest.mark.engine, pytest.mark.slow]
TAIL = 20
N = 150
CHUNK = 48
SINK = {"first_rows": 1, "norm_ratio": 1e9}


@pytest.fixture(scope="module")
def sink_maps(tiny_hybrid, tmp_path_factory):
    from sgl_ridgefill.maps import SplitMaps, hf_fingerprint_layers, load_maps, model_fingerprint, write_maps_folder

    hf = tiny_hybrid.hf
    a, b = random_maps(hf, HYBRID_SPLIT, seed=5)
    fingerprint = model_fingerprint(
        hf.config.to_dict(), hf.model.embed_tokens.weight, hf.model.norm.weight, hf_fingerprint_layers(hf)
    )
    folder = write_maps_folder(tmp_path_factory.mktemp("hybrid-sink") / "maps",
                               [SplitMaps(HYBRID_SPLIT, a, b, {"lambda": None})], model=fingerprint, sink=SINK)
    return folder, load_maps(folder).load_split(HYBRID_SPLIT, dtype=torch.float32)


@pytest.fixture(scope="module")
def results(tiny_hybrid, sink_maps):
    folder, _ = sink_maps
    a, b, p = prompt(40, N), prompt(41, N), prompt(42, 100)
    pq = p + prompt(43, 60)
    steps = [
        request(a, {}, max_new_tokens=2),
        request(b, {"exact_every": 7}),
        request(p, {"enabled": False}),
        request(pq, {}),
    ]
    env = dict(HYBRID_ENV, RIDGEFILL_PREFILL_BACKEND="ridgefill", RIDGEFILL_DIAGNOSTICS="1",
               RIDGEFILL_MAPS=str(folder), RIDGEFILL_SPLIT=str(HYBRID_SPLIT), RIDGEFILL_TAIL=str(TAIL))
    got = run_engine(cpu_engine_kwargs(tiny_hybrid.path, chunked_prefill_size=CHUNK, **HYBRID_ENGINE_KWARGS), steps, env)
    return dict(zip(["sink", "sink_rows", "seed", "cache_hit"], zip([a, b, p, pq], got)))


def _expected(tiny_hybrid, maps, ids, **kw):
    logits = tiny_hybrid.ref.last_logits(ids, split=HYBRID_SPLIT, tail=TAIL, maps=maps, **kw)
    top = logits.log_softmax(-1).topk(3)
    return list(zip(top.values.tolist(), top.indices.tolist()))


def test_sink_row_runs_exactly_among_filled_rows(tiny_hybrid, sink_maps, results):
    _, maps = sink_maps
    ids, got = results["sink"]
    assert got["ridgefill"]["sinks"] == 1 and got["ridgefill"]["exact"] == 1, got["ridgefill"]
    assert_top_close(got, _expected(tiny_hybrid, maps, ids, exact_rows=[0]))
    # Without the sink exact the oracle's answer differs: the test can fail.
    filled = _expected(tiny_hybrid, maps, ids)
    assert max(abs(x - y) for (x, _), (y, _) in zip(got["top"], filled)) > 1e-3


def test_sink_with_a_selection(tiny_hybrid, sink_maps, results):
    _, maps = sink_maps
    ids, got = results["sink_rows"]
    rows = sorted(set(every_kth_row(7, 0, N - TAIL).tolist()) | {0})
    assert_top_close(got, _expected(tiny_hybrid, maps, ids, exact_rows=rows))


def test_cache_hit_has_no_sink_to_run(tiny_hybrid, sink_maps, results):
    _, maps = sink_maps
    ids, got = results["cache_hit"]
    start = got["cached_tokens"]
    assert start >= 90 and got["ridgefill"]["sinks"] == 0, got
    assert_top_close(got, _expected(tiny_hybrid, maps, ids, start=start))
