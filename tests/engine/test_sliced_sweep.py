"""The second sweep in slices, in a real SGLang engine on CPU (``runtime/slicing.py``).

A selecting request whose last chunk comes while another request decodes (a later chunk of a long prompt, or the
only chunk of one that fits) holds back its last tokens, selects with their queries computed into scratch slots,
and runs its exact rows and tail in slices, one per forward, with decode steps between them. Its answer is the unsliced one: the policy selects by the attention of the
last 8 prompt tokens, exactly the held-back ones, and the output matches the PyTorch oracle with the rows that
attention chooses. Alone, the same request runs its sweep in one forward.
"""

from __future__ import annotations

import pytest
from tests.engine.conftest import SPLIT, assert_top_close, attention_policy, attention_rows, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL, N = 20, 150
POLICY = attention_policy("tiny-attention", tail=TAIL)
CHUNK = 160


@pytest.fixture(scope="module")
def run(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    env = policy_env(model, tmp_path_factory, "slicing", POLICY, RIDGEFILL_SLICE_ROWS="16")
    chunked, fits, alone = prompt(70, 2 * N), prompt(71, N), prompt(72, N)
    steps = [
        # The short exact request decodes while the long one's later chunks prefill.
        [request(prompt(73, 10), {"enabled": False}, max_new_tokens=80), request(chunked, {})],
        # The first request takes the whole first batch; the second, which fits one chunk, comes while it decodes.
        [request(prompt(74, CHUNK), {"enabled": False}, max_new_tokens=80), request(fits, {})],
        request(alone, {}),
    ]
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=CHUNK), steps, env)
    return model, {"chunked": (chunked, results[1]), "fits": (fits, results[3]), "alone": (alone, results[4]),
                   "decoding": (None, results[0]), "decoding_too": (None, results[2])}


@pytest.mark.parametrize("case", ["chunked", "fits"])
def test_a_sliced_sweep_answers_as_the_unsliced_one(run, case):
    """In a later chunk of a long prompt, or in the first chunk of one that would fit whole."""
    model, by_case = run
    ids, got = by_case[case]
    meta = got["ridgefill"]
    assert meta["slices"] > 1 and meta["yields"] >= 1, meta  # it did slice, with decode steps between
    rows = attention_rows(model, ids, tail=TAIL)
    assert meta["exact"] == len(rows)
    assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, exact_rows=rows))
    plain = model.expected_top(ids, split=SPLIT, tail=TAIL)  # and not just any rows
    assert abs(plain[0][0] - got["top"][0][0]) > 1e-4


def test_the_decoding_requests_are_served(run):
    _, by_case = run
    for case in ("decoding", "decoding_too"):
        got = by_case[case][1]
        assert got["ridgefill"] == {"ran": False, "reason": "the request asked for exact prefill"}
        assert len(got["output_ids"]) == 80


def test_alone_the_sweep_runs_in_one_forward(run):
    model, by_case = run
    ids, got = by_case["alone"]
    assert "slices" not in got["ridgefill"] and "yields" not in got["ridgefill"]
    assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, exact_rows=attention_rows(model, ids, tail=TAIL)))
