"""The exact upgrade on SGLang's Triton attention backend, in an engine on CPU under the Triton interpreter.

An upgrading request's decode steps run as extend sub-batches (``passes.as_extend``) planned by the Triton
backend: its upper layers over the request's own slots, each slice reading exact keys and values of the rows
before it. After the last slice the request's next decode step reads exact KV, and a later question on the
document finds every cached row exact and runs exactly; both answers match the PyTorch oracle's exact ones.
"""

from __future__ import annotations

import pytest

from sgl_ridgefill.vocabulary import EXACT_CACHE_NOTE
from tests.engine.conftest import SPLIT, assert_top_close, attention_policy, attention_rows, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL, CHUNK = 20, 64  # the upgrade's default: an eighth of the chunk, 8 rows a step
STEPS = 30
INTERPRETER = {"TRITON_INTERPRET": "1"}


@pytest.fixture(scope="module")
def run(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    env = policy_env(model, tmp_path_factory, "triton-upgrade", attention_policy("triton-upgrade", tail=TAIL),
                     RIDGEFILL_CACHE_MODE="namespace", RIDGEFILL_DIAGNOSTICS="1", **INTERPRETER)
    document = prompt(90, 130)
    first_ids, second_ids = document + prompt(91, 10), document + prompt(92, 10)
    engine = cpu_engine_kwargs(model.path, attention_backend="triton", chunked_prefill_size=CHUNK)
    first, second = run_engine(engine, [request(first_ids, max_new_tokens=STEPS), request(second_ids)], env)
    return model, (first_ids, first), (second_ids, second)


def test_the_upgraded_request_decodes_over_exact_kv(run):
    model, (ids, got), _ = run
    assert "error" not in got, got.get("error")
    meta = got["ridgefill"]
    assert meta["ran"] is True and meta["exact"] > 0 and meta["exact_upgrade"] == len(ids)
    assert len(got["output_ids"]) == STEPS
    history = ids + got["output_ids"][:-1]
    # the last step read the prompt and every decoded row, all rewritten exactly by then
    last = got["tops"][-1]
    assert_top_close({"top": last}, model.expected_top(history, split=SPLIT, tail=len(history), arm="exact"))
    rows = attention_rows(model, ids, tail=TAIL)
    filled = model.expected_top(history, split=SPLIT, tail=TAIL + STEPS - 1, exact_rows=rows)
    assert abs(filled[0][0] - last[0][0]) > 1e-4  # without the upgrade the same step reads filled rows


def test_a_later_question_on_the_upgraded_document_runs_exactly(run):
    model, _, (ids, got) = run
    assert "error" not in got, got.get("error")
    meta = got["ridgefill"]
    assert meta["note"] == EXACT_CACHE_NOTE
    assert meta["cached"] == 130 and meta["cached_exact"] == 130 and meta["filled"] == 0
    assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, arm="exact"))
