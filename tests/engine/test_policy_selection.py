"""Selection wired into the runtime: the rows a policy selects are the rows the fill computes exactly.

A server policy selects by attention (lower layers, last query tokens) or by the probe (exact upper layers
of the last rows over the filled cache). The test recomputes those statistics in plain PyTorch, takes the
same top rows, and checks the engine's output against the oracle with exactly those rows exact; the same
count of random rows is the control.
"""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.registry import random_rows
from tests.engine.conftest import SPLIT, assert_top_close, attention_policy, attention_rows, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, run_engine
from tests.support.engines import request as make_request

pytestmark = pytest.mark.engine
TAIL, N, PROBE = 20, 150, 8
BOUNDARY = N - TAIL
COUNT = round(0.10 * BOUNDARY)

POLICIES = {
    "attention": attention_policy("tiny-attention", tail=TAIL),
    "probe": attention_policy("tiny-probe", tail=TAIL, select=f"top(probe(rows={PROBE}), 10%)"),
}


# The probe policy's engine is the longest (its probe pass): outside CI's budget, with -m slow.
@pytest.fixture(scope="module", params=[pytest.param(name, marks=pytest.mark.slow) if name == "probe" else name
                                        for name in sorted(POLICIES)])
def run(request, tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    env = policy_env(model, tmp_path_factory, request.param, POLICIES[request.param], RIDGEFILL_DIAGNOSTICS="1")
    prompts = [prompt(60 + s, N) for s in range(3)]
    steps = [make_request(p, {}) for p in prompts[:2]] + [make_request(prompts[2], {"control": "random", "seed": 5})]
    return request.param, model, prompts, run_engine(cpu_engine_kwargs(model.path), steps, env)


def _selected(kind, model, ids) -> list[int]:
    if kind == "attention":
        return attention_rows(model, ids, tail=TAIL)
    scores = model.ref.probe_scores(ids, split=SPLIT, tail=TAIL, rows=PROBE, maps=model.maps)
    return sorted(torch.topk(scores, COUNT).indices.tolist())


def test_policy_rows_are_the_exact_rows(run):
    kind, model, prompts, results = run
    for ids, got in zip(prompts[:2], results[:2]):
        rows = _selected(kind, model, ids)
        assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, exact_rows=rows))
        # and not just any rows: without them the output differs
        plain = model.expected_top(ids, split=SPLIT, tail=TAIL)
        assert abs(plain[0][0] - got["top"][0][0]) > 1e-4


def test_random_control_uses_as_many_rows(run):
    kind, model, prompts, results = run
    rows = random_rows(COUNT, BOUNDARY, 5).tolist()
    assert_top_close(results[2], model.expected_top(prompts[2], split=SPLIT, tail=TAIL, exact_rows=rows))
