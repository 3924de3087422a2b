"""RidgeFill in bfloat16 on the CPU engine against the float32 oracle: the fill (with the tail spanning chunks,
streamed), exact rows, the value rescale, and maps kept in float32 beside bfloat16 rows. The rest of the suite
pins float32; this is the dtype a GPU serves in. The maps run in the rows' dtype, in float32 beside bfloat16
rows, and streamed from host memory.

bfloat16 keeps 8 bits of mantissa, so the engine's logprobs differ from the float32 oracle's by rounding;
each token the engine ranks in its top 3 must carry the oracle's logprob for that token within ``ATOL``, and
the engine's first choice must be among the oracle's top 3. The arms differ from each other by more than
that, so a wrong fill (or an exact prefill where RidgeFill should run) fails."""

from __future__ import annotations

import pytest

from sgl_ridgefill.runtime.selection import every_kth_row
from tests.engine.conftest import SPLIT
from tests.support.engines import cpu_engine_kwargs, prompt, run_engine
from tests.support.engines import request as make_request

pytestmark = pytest.mark.engine
TAIL, N, ATOL = 20, 150, 0.06
CASES = {
    "ridgefill": ({}, {}),
    "exact_rows": ({"exact_every": 7}, {"exact_rows": every_kth_row(7, 0, N - TAIL).tolist()}),
    "value_rescale": ({"value_rescale": 8}, {"value_rescale": 8}),
}


def _check(model, ids, got, **kw):
    assert "error" not in got, got.get("error")
    logprobs = model.ref.last_logits(ids, split=SPLIT, tail=TAIL, maps=model.maps, **kw).log_softmax(-1)
    oracle_top = logprobs.topk(3).indices.tolist()
    assert got["top"][0][1] in oracle_top, (got["top"], oracle_top)
    for lp, token in got["top"]:
        assert abs(lp - float(logprobs[token])) <= ATOL, (token, lp, float(logprobs[token]))


# One engine per map dtype and residence; CI runs the bfloat16 maps (float32 maps and streamed maps are the
# same fill on other inputs, and tests/runtime/test_map_stream.py checks streaming without an engine).
@pytest.fixture(scope="module", params=[("auto", "device"), pytest.param(("float32", "device"), marks=pytest.mark.slow),
                                        pytest.param(("auto", "host"), marks=pytest.mark.slow)],
                ids=["maps-bfloat16", "maps-float32", "maps-streamed"])
def results(request, tiny_models):
    model = tiny_models("llama")
    steps = [make_request(prompt(60 + i, N), params) for i, (params, _) in enumerate(CASES.values())]
    steps.append(make_request(prompt(70, N), {"enabled": False}))
    env = {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_DIAGNOSTICS": "1", "RIDGEFILL_MAPS": str(model.maps_dir),
           "RIDGEFILL_SPLIT": str(SPLIT), "RIDGEFILL_TAIL": str(TAIL), "RIDGEFILL_MAP_DTYPE": request.param[0], "RIDGEFILL_MAP_RESIDENCE": request.param[1]}
    out = run_engine(cpu_engine_kwargs(model.path, dtype="bfloat16"), steps, env)
    return model, out


@pytest.mark.parametrize("case", list(CASES))
def test_bfloat16_matches_the_oracle(results, case):
    model, out = results
    i = list(CASES).index(case)
    _check(model, prompt(60 + i, N), out[i], **CASES[case][1])
    assert out[i]["ridgefill"]["ran"]


def test_exact_in_bfloat16_matches_the_exact_oracle_and_the_check_tells_the_arms_apart(results):
    model, out = results
    _check(model, prompt(70, N), out[-1], arm="exact")
    # The same check against the RidgeFill oracle fails for the exact answer: the tolerance is tighter than
    # the fill's effect on these prompts.
    with pytest.raises(AssertionError):
        _check(model, prompt(70, N), out[-1])
