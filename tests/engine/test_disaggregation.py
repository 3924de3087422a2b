"""RidgeFill on a PD prefill worker with a stock decode worker, over Mooncake's TCP transport on 127.0.0.1.

The same requests run once through a monolithic RidgeFill server and once through a prefill worker (RidgeFill
on) and a decode worker (plugin installed, RidgeFill off, radix cache on): RidgeFill arms, exact rows, value
rescale, chunked prefill (chunks of 48, prompts of 40 to 200 tokens), exact requests, a prompt shorter than
the tail and follow-up turns that reuse the decode worker's own cache. Every answer of the decode worker must
equal the monolithic server's (greedy tokens, logprobs within the CPU tolerance); filled KV must never enter
the decode worker's radix tree (an exact request after a RidgeFill request on the same prompt finds nothing
cached there and equals the oracle's exact answer); ``nofill`` runs exact under PD.
"""

from __future__ import annotations

import pytest
import requests

from tests.engine.conftest import SPLIT, assert_top_close
from tests.support.engines import prompt, request
from tests.support.pd import mooncake_available, pd_servers
from tests.support.server import cpu_server

pytestmark = [pytest.mark.engine, pytest.mark.slow]
TAIL = 20
NEW = 4


def _common(model) -> list[str]:
    return ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.2", "--chunked-prefill-size", "48"]  # 0.2: see test_tensor_parallel.MEM


def _ridgefill(model) -> list[str]:
    return ["--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir), "--ridgefill-split", str(SPLIT),
            "--ridgefill-tail", str(TAIL), "--ridgefill-diagnostics"]


def _body(ids, ridgefill=None):
    return request(ids, ridgefill, max_new_tokens=NEW)


# (name, body for the PD pair, body for the monolithic server when it differs, what the oracle checks).
# The second turn's prompt is the first turn's prompt, its answer on the same deployment, and 40 new tokens.
# Its RidgeFill request is checked against the oracle in test_prefill_worker_reports_what_ran.
def _cases() -> list:
    p = {s: prompt(400 + s, n) for s, n in enumerate((150, 150, 150, 150, 120, 200, 40, 97, 150, 150, 130, 10, 110))}
    q = p[12]
    return [
        ("ridgefill", _body(p[0]), None, dict(ids=p[0])),
        ("exact_after_ridgefill", _body(p[0], {"enabled": False}), None, dict(ids=p[0], arm="exact")),
        ("identity", _body(p[1], {"arm": "identity"}), None, dict(ids=p[1], arm="identity")),
        ("exact_every", _body(p[2], {"exact_every": 7}), None, dict(ids=p[2], exact_rows=list(range(6, 130, 7)))),
        ("value_rescale", _body(p[3], {"value_rescale": 8}), None, dict(ids=p[3], value_rescale=8)),
        ("ridgefill_120", _body(p[4]), None, dict(ids=p[4])),
        ("ridgefill_200", _body(p[5]), None, dict(ids=p[5])),
        ("one_chunk", _body(p[6]), None, dict(ids=p[6])),
        ("exact_97", _body(p[7], {"enabled": False}), None, dict(ids=p[7], arm="exact")),
        ("long_tail", _body(p[8], {"tail": 60}), None, dict(ids=p[8], tail=60)),
        ("nofill_runs_exact", _body(p[9], {"arm": "nofill"}), _body(p[9], {"enabled": False}), dict(ids=p[9], arm="exact")),
        ("identity_rows", _body(p[10], {"arm": "identity", "exact_every": 5}), None,
         dict(ids=p[10], arm="identity", exact_rows=list(range(4, 110, 5)))),
        ("short_prompt", _body(p[11]), None, dict(ids=p[11], arm="exact")),
        ("ridgefill_again", _body(p[0]), None, None),  # after exact_after_ridgefill: the whole prefix is cached
        ("exact_97_again", _body(p[7], {"enabled": False}), None, None),
        ("turn_1_exact", _body(q, {"enabled": False}), None, dict(ids=q, arm="exact")),
        # Follow-up turns: prompt = previous prompt + its answer + more. The decode worker holds the first turn
        # (prompt and answer) in its radix cache, the prefill worker only its prompt.
        ("turn_2_ridgefill", _body([]), None, None),
        ("turn_2_exact", _body([], {"enabled": False}), None, None),
        ("ridgefill_exact_every_3", _body(p[5], {"exact_every": 3}), None,
         dict(ids=p[5], exact_rows=list(range(2, 180, 3)))),
        ("identity_200", _body(p[5], {"arm": "identity"}), None, dict(ids=p[5], arm="identity")),
        ("ridgefill_150_again", _body(p[1]), None, dict(ids=p[1])),
    ]


def _run(generate) -> dict:
    """Run every case in order through ``generate(body) -> Response``; the second turn is built from the
    first turn's answer on the same deployment."""
    out = {}
    first = None
    for name, pd_body, mono_body, _ in _cases():
        body = pd_body if generate.pd else (mono_body or pd_body)
        if name.startswith("turn_2"):
            # The answer without its last token, whose KV a monolithic server never computes; SGLang's decode
            # worker (overlap scheduler) does and caches it, which would put one more exact row there.
            ids = first["ids"] + first["answer"][:-1] + prompt(499, 40)
            body = dict(body, input_ids=ids)
        resp = generate(body)
        assert resp.status_code == 200, (name, resp.text[:2000])
        meta = resp.json()["meta_info"]
        prefill_meta = generate.prefill_meta() if generate.pd else meta
        out[name] = {
            "output_ids": resp.json()["output_ids"],
            "tops": [[[x[0], x[1]] for x in t] for t in meta["output_top_logprobs"]],
            "cached": meta["cached_tokens"],
            "ridgefill": prefill_meta.get("ridgefill"),  # what ran, as the server that prefilled reports it
            "ids": body["input_ids"],
        }
        if name == "turn_1_exact":
            first = {"ids": body["input_ids"], "answer": out[name]["output_ids"]}
    return out


class _Mono:
    pd = False

    def __init__(self, url):
        self.url = url

    def __call__(self, body):
        return requests.post(self.url + "/generate", json=body, timeout=600)


class _PD:
    pd = True

    def __init__(self, client):
        self.client = client
        self._prefill = None

    def __call__(self, body):
        self._prefill, decode = self.client.generate_both(body)
        assert self._prefill.status_code == 200, self._prefill.text[:2000]
        return decode

    def prefill_meta(self) -> dict:
        return self._prefill.json()["meta_info"]


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    why = mooncake_available()
    if why is not None:
        pytest.skip(why)
    model = tiny_models("llama")
    logs = tmp_path_factory.mktemp("pd")
    with cpu_server(_common(model) + _ridgefill(model), log_path=str(logs / "mono.log")) as url:
        mono = _run(_Mono(url))
    decode_args = _common(model) + ["--disaggregation-decode-enable-radix-cache"]
    with pd_servers(_common(model) + _ridgefill(model), decode_args, log_dir=logs) as client:
        pd = _run(_PD(client))
    return model, mono, pd


NAMES = [c[0] for c in _cases()]


def test_enough_requests():
    assert len(NAMES) >= 20


def test_decode_worker_equals_monolithic_server(runs):
    _, mono, pd = runs
    mismatches = []
    for name in NAMES:
        a, b = pd[name], mono[name]
        same = a["output_ids"] == b["output_ids"] and all(
            [t for _, t in x] == [t for _, t in y] and max(abs(u - v) for (u, _), (v, _) in zip(x, y)) < 1e-4
            for x, y in zip(a["tops"], b["tops"])
        )
        if not same:
            mismatches.append((name, a, b))
    assert mismatches == [], mismatches


@pytest.mark.parametrize("name", [c[0] for c in _cases() if c[3] is not None])
def test_decode_worker_matches_the_oracle(runs, name):
    model, _, pd = runs
    expect = dict(next(c[3] for c in _cases() if c[0] == name))
    ids = expect.pop("ids")
    expect.setdefault("tail", TAIL)
    assert_top_close({"top": pd[name]["tops"][0]}, model.expected_top(ids, split=SPLIT, **expect))


def test_no_filled_kv_in_the_decode_workers_radix_tree(runs):
    """The decode worker's radix cache is on. An exact request on the prompt a RidgeFill request just decoded
    finds nothing cached (the RidgeFill KV was never inserted) and is exact; an exact request repeated does
    find its own prompt (the cache works), and so does a follow-up turn."""
    _, mono, pd = runs
    assert pd["exact_after_ridgefill"]["cached"] == 0
    assert pd["exact_97_again"]["cached"] >= 96
    assert pd["turn_2_exact"]["cached"] > len(prompt(412, 110))  # the first turn's prompt and answer
    assert pd["turn_2_exact"]["cached"] == mono["turn_2_exact"]["cached"]


def test_ridgefill_ran_on_the_prefill_worker(runs):
    """Guards the comparisons against passing trivially: RidgeFill answers differ from exact ones."""
    model, _, pd = runs
    ids = prompt(400, 150)
    exact = model.expected_top(ids, split=SPLIT, tail=TAIL, arm="exact")
    assert abs(pd["ridgefill"]["tops"][0][0][0] - exact[0][0]) > 1e-3
    assert pd["ridgefill"]["output_ids"] != pd["exact_after_ridgefill"]["output_ids"] or \
        pd["ridgefill"]["tops"] != pd["exact_after_ridgefill"]["tops"]


def test_prefill_worker_reports_what_ran(runs):
    """The prefill worker's ``meta_info["ridgefill"]`` says what ran, as the monolithic server's does; on the
    second turn the rows the decode worker already holds ran exact (the monolithic server held them in its
    own cache, the prefill worker only the first turn's prompt)."""
    model, mono, pd = runs
    for name in NAMES:
        if name in ("nofill_runs_exact", "turn_2_ridgefill"):
            continue
        assert pd[name]["ridgefill"] == mono[name]["ridgefill"], name
    assert pd["nofill_runs_exact"]["ridgefill"]["ran"] is False
    assert "PD prefill worker" in pd["nofill_runs_exact"]["ridgefill"]["reason"]
    first_turn = len(prompt(412, 110))
    a, b = pd["turn_2_ridgefill"]["ridgefill"], mono["turn_2_ridgefill"]["ridgefill"]
    assert a["ran"] and b["ran"]
    assert first_turn - 1 <= a["cached"] <= first_turn and a["exact"] > 0
    assert a["cached"] + a["exact"] == b["cached"] and b["exact"] == 0
    assert a["filled"] == b["filled"]
    # Against the oracle: every row the decode worker held is exact, the rest of the prefix filled.
    ids = pd["turn_2_ridgefill"]["ids"]
    expected = model.expected_top(ids, split=SPLIT, tail=TAIL, start=a["cached"] + a["exact"])
    assert_top_close({"top": pd["turn_2_ridgefill"]["tops"][0]}, expected)
