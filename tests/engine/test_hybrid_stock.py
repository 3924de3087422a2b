"""SGLang's own Qwen3.5 model class on this CPU (the shim's stand-in ops), RidgeFill off: equal to
transformers' Qwen3.5, and byte-identical to a RidgeFill server whose requests run exactly.

The stock server is started by the CPU launcher (``python -m sgl_ridgefill.cpu.launch_server``), which adds
the hybrid flags itself (``--mamba-radix-cache-strategy no_buffer --disable-overlap-schedule``). The prompts
cover chunked prefill (150 and 97 tokens at 48-row chunks) and a single chunk (15 tokens), each with four
decode steps whose top-5 logprobs are compared.
"""

from __future__ import annotations

import pytest
import requests

from tests.engine.conftest import HYBRID_ENGINE_KWARGS, HYBRID_ENV, HYBRID_LAYERS, HYBRID_SPLIT, assert_top_close
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine
from tests.support.server import cpu_server

# Outside CI's time budget (run with -m slow): stock SGLang against transformers on a hybrid (about 2.5 min): a
# check of the CPU launcher, with -m slow
pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS = [prompt(40 + s, n) for s, n in enumerate((150, 97, 15))]
STEPS, TOP = 4, 5


def _generate(url: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": STEPS, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": TOP}
    out = requests.post(url + "/generate", json=body, timeout=600).json()
    meta = out["meta_info"]
    return {
        "output_ids": out["output_ids"],
        "logprobs": [x[0] for x in meta["output_token_logprobs"]],
        "tops": [[[x[0], x[1]] for x in t] for t in meta["output_top_logprobs"]],
    }


@pytest.fixture(scope="module")
def runs(tiny_hybrid):
    model = tiny_hybrid
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.25", "--max-mamba-cache-size", "32", "--chunked-prefill-size", "48",
            "--disable-radix-cache", "--skip-tokenizer-init"]
    with cpu_server(args, env=HYBRID_ENV) as url:
        stock = [_generate(url, ids) for ids in PROMPTS]
    env = dict(HYBRID_ENV, RIDGEFILL_PREFILL_BACKEND="ridgefill", RIDGEFILL_MAPS=str(model.maps_dir),
               RIDGEFILL_SPLIT=str(HYBRID_SPLIT), RIDGEFILL_TAIL="20")
    engine = cpu_engine_kwargs(model.path, disable_radix_cache=True, **HYBRID_ENGINE_KWARGS)
    steps = [request(p, rf, max_new_tokens=STEPS, top=TOP) for rf in ({"enabled": False}, {"split": HYBRID_LAYERS}, {})
             for p in PROMPTS]
    on = run_engine(engine, steps, env)
    n = len(PROMPTS)
    return model, stock, {"disabled": on[:n], "split_eq_layers": on[n : 2 * n], "ridgefill": on[2 * n :]}


def _strip(results):
    return [(r["output_ids"], r["logprobs"], r["tops"]) for r in results]


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_stock_equals_transformers(runs, which):
    """Every step's top-5 next tokens and logprobs (prefill, then decode over SGLang's states)."""
    model, stock, _ = runs
    ids = list(PROMPTS[which])
    got = stock[which]
    for step in range(STEPS):
        expected = model.expected_top(ids, k=TOP, split=HYBRID_SPLIT, tail=20, arm="exact")
        assert_top_close({"top": got["tops"][step]}, expected)
        ids.append(got["output_ids"][step])


def test_requests_that_run_exactly_are_byte_identical(runs):
    _, stock, on = runs
    assert _strip(on["disabled"]) == _strip(stock)
    assert _strip(on["split_eq_layers"]) == _strip(stock)


def test_ridgefill_changes_long_prompts_only(runs):
    _, stock, on = runs
    assert on["ridgefill"][0]["logprobs"] != stock[0]["logprobs"]
    assert _strip(on["ridgefill"])[2] == _strip(stock)[2]  # 15 tokens: shorter than the tail, so exact
