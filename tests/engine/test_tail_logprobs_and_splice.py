"""Prompt logprobs of the tail under RidgeFill, and the splice diagnostic, in a real SGLang engine on CPU,
against the PyTorch oracle (``tests/support/reference.py``).

The tail rows run the full model, so their prompt logprobs are served under RidgeFill when the request
asks for them from the tail on and the prompt is prefilled in one chunk; otherwise the request runs
exactly. The splice arms rewrite the filled rows' keys, values, both, or only the key magnitude with the
exact model's, which is what ``sgl-ridgefill eval`` measures.
"""

from __future__ import annotations

import pytest

from tests.engine.conftest import SPLIT
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
TAIL = 20
N = 90  # fits one chunk
LONG = 150  # two chunks
CHUNK = 100
TOP = 3


def _lp(ids, ridgefill=None, start=None):
    step = request(ids, ridgefill, top=TOP)
    step["logprob_start_len"] = N - TAIL if start is None else start
    return step


def _cases():
    a, b, c = prompt(1, N), prompt(2, N), prompt(3, LONG)
    # RidgeFill requests insert nothing into the radix cache; the exact ones come last so that no RidgeFill
    # request finds its prompt cached (it would then have nothing left to fill).
    return [
        ("ridgefill", _lp(a), dict(ids=a)),
        ("identity", _lp(b, {"arm": "identity"}), dict(ids=b, arm="identity")),
        ("splice_both", _lp(a, {"splice": "both"}), dict(ids=a, splice="both")),
        ("splice_keys", _lp(a, {"splice": "keys"}), dict(ids=a, splice="keys")),
        ("splice_values", _lp(a, {"splice": "values"}), dict(ids=a, splice="values")),
        ("splice_key_norm", _lp(a, {"splice": "key_norm"}), dict(ids=a, splice="key_norm")),
        ("splice_keys_layer_3", _lp(a, {"splice": "keys@3-3"}), dict(ids=a, splice="keys@3-3")),
        ("identity_values", _lp(b, {"arm": "identity", "splice": "values"}), dict(ids=b, arm="identity", splice="values")),
        ("two_chunks", _lp(c, None, start=LONG - TAIL), dict(ids=c, arm="exact")),
        ("nofill_splice", _lp(a, {"arm": "nofill", "splice": "keys"}), dict(error="nofill")),
        ("before_tail", _lp(a, None, start=N - TAIL - 5), dict(ids=a, arm="exact", start_row=N - TAIL - 5)),
        ("exact", _lp(a, "exact"), dict(ids=a, arm="exact")),
    ]


@pytest.fixture(scope="module")
def engine_run(tiny_models):
    model = tiny_models("qwen2")
    cases = _cases()
    env = {
        "RIDGEFILL_PREFILL_BACKEND": "ridgefill",
        "RIDGEFILL_DIAGNOSTICS": "1",
        "RIDGEFILL_MAPS": str(model.maps_dir),
        "RIDGEFILL_SPLIT": str(SPLIT),
        "RIDGEFILL_TAIL": str(TAIL),
        "RIDGEFILL_CACHE_MODE": "no_insert",  # every request on a prompt computes its own fill (see _cases)
    }
    results = run_engine(cpu_engine_kwargs(model.path, chunked_prefill_size=CHUNK), [s for _, s, _ in cases], env)
    return model, {name: (expect, got) for (name, _, expect), got in zip(cases, results)}


def _expected_tops(model, expect):
    kw = {k: v for k, v in expect.items() if k not in ("ids", "start_row")}
    ids = expect["ids"]
    start = expect.get("start_row", len(ids) - TAIL)
    if kw.get("arm") == "exact":
        logits = model.ref.last_logits(ids, split=SPLIT, tail=len(ids) - start, arm="exact", tail_rows=True)
    else:
        logits = model.ref.last_logits(ids, split=SPLIT, tail=TAIL, maps=model.maps, tail_rows=True, **kw)
    top = logits.log_softmax(-1).topk(TOP)
    return [list(zip(v.tolist(), i.tolist())) for v, i in zip(top.values, top.indices)]


def _assert_rows_close(got_rows, expected_rows, atol=2e-3):
    # Prompt row r predicts token r+1: SGLang's entry j for start s is row s+j-1's distribution for j >= 1.
    assert len(got_rows) == len(expected_rows)
    for j in range(1, len(got_rows)):
        got, exp = got_rows[j], expected_rows[j - 1]
        assert [t for _, t in got] == [t for _, t in exp], (j, got, exp)
        for (lg, _), (le, _) in zip(got, exp):
            assert abs(lg - le) <= atol, (j, got, exp)


@pytest.mark.parametrize(
    "case",
    ["exact", "ridgefill", "identity", "splice_both", "splice_keys", "splice_values", "splice_key_norm",
     "splice_keys_layer_3", "identity_values", "before_tail", "two_chunks"],
)
def test_tail_logprobs_match_reference(engine_run, case):
    model, by_name = engine_run
    expect, got = by_name[case]
    assert "error" not in got, got.get("error")
    assert_rows = got["input_tops"]
    _assert_rows_close(assert_rows, _expected_tops(model, expect))


def test_splice_both_is_exact_and_the_others_are_not(engine_run):
    """Exact keys and values on every filled row give the exact model's tail; a single component does not."""
    _, by_name = engine_run
    exact = by_name["exact"][1]["input_logprobs"][1:]
    both = by_name["splice_both"][1]["input_logprobs"][1:]
    assert max(abs(x - y) for x, y in zip(exact, both)) < 2e-3
    for case in ("ridgefill", "splice_keys", "splice_values", "splice_key_norm"):
        other = by_name[case][1]["input_logprobs"][1:]
        assert max(abs(x - y) for x, y in zip(exact, other)) > 1e-3, case


def test_a_layer_range_splices_only_those_layers(engine_run):
    """``keys@3-3`` splices the last layer only: between the fill and exact keys on every upper layer."""
    _, by_name = engine_run
    ridgefill, every, last = (by_name[c][1]["input_logprobs"][1:] for c in ("ridgefill", "splice_keys", "splice_keys_layer_3"))
    assert max(abs(x - y) for x, y in zip(last, ridgefill)) > 1e-4
    assert max(abs(x - y) for x, y in zip(last, every)) > 1e-4


def test_splice_needs_filled_rows(engine_run):
    _, by_name = engine_run
    _, got = by_name["nofill_splice"]
    assert "error" in got and "nofill" in got["error"]
