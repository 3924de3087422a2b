"""RidgeFill on SGLang's Triton attention backend, end to end in an engine on CPU.

SGLang's Triton extend and decode kernels run on CPU tensors under ``TRITON_INTERPRET=1`` in float32, so the
GPU code path (``sgl_ridgefill/attention/triton.py``: virtual requests, compacted key lists, grouped custom
masks, compacted decode lists) runs here against the PyTorch oracle (``tests/support/reference.py``), and
RidgeFill off against stock SGLang on the same backend, byte for byte.
"""

from __future__ import annotations

import math

import pytest

from sgl_ridgefill.runtime.runtime import GROUP_SIZE
from sgl_ridgefill.runtime.selection import every_kth_row
from sgl_ridgefill.selectors.registry import random_rows
from tests.engine.conftest import SPLIT, assert_decode_matches, assert_top_close, attention_policy, attention_rows, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL, N, CHUNK = 20, 150, 64
BOUNDARY = N - TAIL
INTERPRETER = {"TRITON_INTERPRET": "1"}
POLICY = attention_policy("triton-attention", tail=TAIL)


def plain(**kw) -> dict:
    """The bare fill (shipped policy ``plain``) at this test's split and tail."""
    return {"policy": "plain", "tail": TAIL, **kw}


def _cases():
    a, b, c, d, e, f, g, h, i, r = (prompt(70 + s, N) for s in range(10))
    p = prompt(81, 100)
    pq = p + prompt(82, 60)
    return [
        ("ridgefill", request(a, plain(), max_new_tokens=3), dict(ids=a)),
        ("identity", request(b, plain(arm="identity")), dict(ids=b, arm="identity")),
        ("nofill", request(c, plain(arm="nofill"), max_new_tokens=3), dict(ids=c, arm="nofill")),
        ("exact_every", request(d, plain(exact_every=7)), dict(ids=d, exact_rows=every_kth_row(7, 0, BOUNDARY).tolist())),
        ("random_rows", request(r, plain(exact_every=7, control="random", seed=3)),
         dict(ids=r, exact_rows=random_rows(len(every_kth_row(7, 0, BOUNDARY)), BOUNDARY, 3).tolist())),
        ("attention_topk", request(e, {}), dict(ids=e, exact_rows="attention")),
        ("value_rescale", request(f, plain(value_rescale=8)), dict(ids=f, value_rescale=8)),
        ("long_tail", request(g, plain(tail=80)), dict(ids=g, tail=80)),
        ("batch", [request(h, plain()), request(i, {"enabled": False}), request(a, plain(arm="identity"))],
         [dict(ids=h), dict(ids=i, arm="exact"), dict(ids=a, arm="identity")]),
        ("cache_seed", request(p, {"enabled": False}), dict(ids=p, arm="exact")),
        ("cache_hit", request(pq, plain()), dict(ids=pq, start="cached")),
    ]


def _flatten(cases):
    for name, step, expect in cases:
        if isinstance(step, list):
            yield from ((f"{name}[{j}]", e) for j, e in enumerate(expect))
        else:
            yield name, expect


@pytest.fixture(scope="module")
def run(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    env = policy_env(model, tmp_path_factory, "triton", POLICY, RIDGEFILL_DIAGNOSTICS="1", **INTERPRETER)
    cases = _cases()
    engine = cpu_engine_kwargs(model.path, attention_backend="triton", chunked_prefill_size=CHUNK)
    results = run_engine(engine, [step for _, step, _ in cases], env)
    names = list(_flatten(cases))
    assert len(results) == len(names)
    return model, {name: (expect, got) for (name, expect), got in zip(names, results)}


CASES = ["ridgefill", "identity", "nofill", "exact_every", "random_rows", "value_rescale", "long_tail", "batch[0]",
         "batch[1]", "batch[2]", "cache_seed"]


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(run, case):
    model, by_name = run
    expect, got = by_name[case]
    kw = dict(expect)
    ids = kw.pop("ids")
    kw.setdefault("tail", TAIL)
    assert_top_close(got, model.expected_top(ids, split=SPLIT, **kw))


def test_attention_selected_rows_are_the_exact_rows(run):
    model, by_name = run
    expect, got = by_name["attention_topk"]
    ids = expect["ids"]
    rows = attention_rows(model, ids, tail=TAIL)
    assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, exact_rows=rows))
    assert got["ridgefill"]["exact"] == len(rows)


@pytest.mark.parametrize("case", ["ridgefill", "nofill"])
def test_decode_steps_on_the_triton_decode_kernel(run, case):
    """Decode runs the full model over the filled cache; nofill's decode reads compacted key lists."""
    model, by_name = run
    expect, got = by_name[case]
    assert_decode_matches(model, expect, got, tail=TAIL)


def test_radix_hit_inside_the_prompt(run):
    model, by_name = run
    expect, got = by_name["cache_hit"]
    assert got["cached_tokens"] >= 90
    assert_top_close(got, model.expected_top(expect["ids"], split=SPLIT, tail=TAIL, start=got["cached_tokens"]))


def test_scattered_rows_run_as_groups(run):
    """Grouped mode: the exact rows of ``exact_every`` are scattered single rows; they run as
    ceil(rows / G) masked virtual requests beside the tail's run, not one request each."""
    _, by_name = run
    meta = by_name["exact_every"][1]["ridgefill"]
    n_exact = len(every_kth_row(7, 0, BOUNDARY))
    assert meta["ran"] and meta["exact"] == n_exact
    assert 1 <= meta["groups"] <= math.ceil(n_exact / GROUP_SIZE)
    assert meta["virtual_requests"] <= math.ceil(n_exact / GROUP_SIZE) + meta["upper_steps"]


def test_a_tail_longer_than_the_chunk_runs_in_steps(run):
    """C8: the upper pass runs within SGLang's chunk budget: an 80-row tail over 64-row chunks takes two steps."""
    _, by_name = run
    assert by_name["long_tail"][1]["ridgefill"]["upper_steps"] == math.ceil(80 / CHUNK)


@pytest.mark.slow  # two more engines under the interpreter (about 2 min); off-is-stock runs in tests/engine
def test_ridgefill_off_is_stock_on_triton(run, tiny_models):
    """RidgeFill off for a request (and the plugin absent) give the same bytes on the Triton backend."""
    model, by_name = run
    ids = by_name["cache_seed"][0]["ids"]
    engine = cpu_engine_kwargs(model.path, attention_backend="triton", chunked_prefill_size=CHUNK, disable_radix_cache=True)
    steps = [request(ids, None, max_new_tokens=2)]
    stock = run_engine(engine, steps, INTERPRETER, plugins="smg-servicer")
    off = run_engine(engine, [request(ids, {"enabled": False}, max_new_tokens=2)],
                     {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_MAPS": str(model.maps_dir), **INTERPRETER})
    strip = [(r["output_ids"], r["logprobs"], r["tops"]) for r in (stock[0], off[0])]
    assert strip[0] == strip[1]
