"""Maps of every kind (``sgl_ridgefill/maps/kinds.py``) served by a real SGLang engine on CPU equal the
PyTorch oracle, sink rows included: the ``normalised`` kind through the layer's own norm and projections,
the ``kv`` kinds' K through the layer's K norm and RoPE, a ``kv+context`` fill carrying its running mean
across prefill chunks, and a ``kv+context`` plan never reusing a cached prefix.
"""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.tools.synthetic import make_tiny_maps
from sgl_ridgefill.maps import load_maps
from tests.engine.conftest import SPLIT, assert_decode_matches, assert_top_close
from tests.support.engines import cpu_engine_kwargs, prompt, run_engine
from tests.support.engines import request as ask  # `request` is pytest's fixture here

pytestmark = pytest.mark.engine
TAIL = 20
N = 150
SINK = {"first_rows": 1, "norm_ratio": 10.0}

# (family, map kind, chunked prefill size): Qwen2 has K/V biases, Qwen3 a K norm; chunks of 37 put the
# boundary and the context's carry inside chunks.
# Two engines run in the README's test command; the other two (an engine each, about 2.5 minutes) are slow.
SERVED = [
    pytest.param(("qwen2", "normalised", 48), marks=pytest.mark.slow),
    ("qwen3", "kv", 64),
    ("qwen2", "kv+context", 37),
    pytest.param(("qwen3", "kv+context", 512), marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=SERVED, ids=lambda p: f"{p[0]}-{p[1]}-{p[2]}")
def served(request, tiny_models, tmp_path_factory):
    family, kind, chunk = request.param
    model = tiny_models(family)
    maps_dir = make_tiny_maps(model.path, tmp_path_factory.mktemp("kinds") / kind, split=SPLIT, kind=kind, sink=SINK)
    folder = load_maps(maps_dir)
    maps = folder.load_split(SPLIT, dtype=torch.float32)
    a, b, c, p = prompt(21, N), prompt(22, N), prompt(23, N - 30), prompt(24, 100)
    steps = [
        ask(a, max_new_tokens=3),
        ask(b, {"exact_rows": [10, 50, 90]}),
        [ask(c), ask(a, {"enabled": False})],
        ask(p, {"enabled": False}),  # seeds the radix cache
        ask(p + prompt(25, 60)),  # a RidgeFill request whose first 100 tokens are cached
    ]
    if not folder.kind.context:
        steps.append(ask(b, {"value_rescale": 8}))
    env = {
        "RIDGEFILL_PREFILL_BACKEND": "ridgefill",
        "RIDGEFILL_DIAGNOSTICS": "1",
        "RIDGEFILL_MAPS": str(maps_dir),
        "RIDGEFILL_SPLIT": str(SPLIT),
        "RIDGEFILL_TAIL": str(TAIL),
        "RIDGEFILL_CACHE_MODE": "no_insert",  # the RidgeFill request after the exact seed reuses its prefix
    }
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=chunk), steps, env)
    prompts = [a, b, c, a, p, p + prompt(25, 60), b]

    def expected(i: int, **kw):
        return model.expected_top(prompts[i], maps=maps, map_kind_name=kind, sink=SINK, split=SPLIT, tail=TAIL, **kw)

    return model, folder, results, prompts, expected, maps


def test_fill_matches_the_oracle(served):
    model, folder, results, prompts, expected, _ = served
    assert_top_close(results[0], expected(0))
    assert_top_close(results[1], expected(1, exact_rows=[10, 50, 90]))
    assert_top_close(results[2], expected(2))
    assert_top_close(results[3], expected(3, arm="exact"))
    for got in (results[0], results[1], results[2]):
        assert got["ridgefill"]["ran"], got["ridgefill"]
        assert got["ridgefill"]["sinks"] >= SINK["first_rows"]  # position 0 at least runs exactly
    meta = results[1]["ridgefill"]
    assert meta["exact"] >= max(3, meta["sinks"])  # the given rows and the sinks


def test_decode_reads_the_filled_cache(served):
    model, folder, results, prompts, expected, maps = served
    got, ids = results[0], list(prompts[0])
    for step in (1, 2):
        ids.append(got["output_ids"][step - 1])
        want = model.expected_top(ids, maps=maps, map_kind_name=folder.kind.name, sink=SINK, split=SPLIT, tail=TAIL + step)
        assert_top_close({"top": got["tops"][step]}, want)


def test_cached_prefix(served):
    """A residual-like kind reuses the exact cached prefix; a kv+context plan needs every row's split
    state, so it never matches the cache and fills the whole prefix itself."""
    model, folder, results, prompts, expected, _ = served
    got = results[5]
    assert got["ridgefill"]["ran"], got["ridgefill"]
    if folder.kind.context:
        assert got["cached_tokens"] == 0
        assert_top_close(got, expected(5))
    else:
        assert got["cached_tokens"] >= 90
        assert_top_close(got, expected(5, start=got["cached_tokens"]))


def test_value_rescale(served):
    model, folder, results, prompts, expected, _ = served
    if folder.kind.context:
        pytest.skip("value_rescale is refused with kv+context maps (tests/runtime/test_admission.py)")
    assert_top_close(results[6], expected(6, value_rescale=8))


def test_kind_differs_from_exact(served):
    """Guards the comparisons against passing trivially."""
    model, folder, results, prompts, expected, _ = served
    exact = expected(0, arm="exact")
    assert abs(results[0]["top"][0][0] - exact[0][0]) > 1e-3
