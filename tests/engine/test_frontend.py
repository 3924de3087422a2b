"""``@sgl.function`` programs against a real CPU server through ``RidgeFillEndpoint``.

Every ``/generate`` body leaving this process is recorded below SGLang's ``http_request`` (at
``urllib.request.urlopen`` and ``requests.post``), so the checks see what went over the wire, not what the
endpoint meant to send. The server runs ``--ridgefill-cache-mode namespace`` with a server default
(tail 20) unlike the endpoint's (tail 16): a prefix-caching request sent without the endpoint's
parameters would land in another namespace, and the forks after it would find nothing cached.
"""

from __future__ import annotations

import inspect
import json
import pathlib
import urllib.request

import pytest
import requests

from tests.engine.conftest import SPLIT
from tests.support.engines import MEM_FRACTION
from tests.support.server import cpu_server

pytestmark = pytest.mark.engine
SERVER_TAIL = 20
PARAMS = {"arm": "ridgefill", "tail": 16}
INSTRUCTIONS = (
    "You are a careful reader. Answer each question about the module below in one short line, "
    "citing the names you rely on.\n"
)


def _document(module_name: str, chars: int = 600) -> str:
    """A few hundred tokens of real text: the head of a standard-library module's source."""
    module = __import__(module_name)
    return pathlib.Path(inspect.getsourcefile(module)).read_text()[:chars]


@pytest.fixture(scope="module")
def frontend():
    """SGLang's frontend imports torch and more; load it only when these tests run, not at collection."""
    import sglang as sgl

    from sgl_ridgefill import frontend

    return sgl, frontend


@pytest.fixture(scope="module")
def server(tiny_models):
    model = tiny_models("llama")
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", str(MEM_FRACTION), "--chunked-prefill-size", "48",
            "--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir),
            "--ridgefill-split", str(SPLIT), "--ridgefill-tail", str(SERVER_TAIL),
            "--ridgefill-cache-mode", "namespace"]
    with cpu_server(args) as url:
        yield model, url


@pytest.fixture(scope="module")
def tokenizer(server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(server[0].path))


@pytest.fixture
def endpoint(frontend, server):
    sgl, fe = frontend
    from sglang.lang.global_config import global_config

    previous = global_config.default_backend
    ep = fe.RidgeFillEndpoint(server[1], ridgefill=PARAMS)
    sgl.set_default_backend(ep)
    yield ep
    sgl.set_default_backend(previous)


@pytest.fixture
def sent(monkeypatch):
    """The JSON bodies of every ``/generate`` POST made while the test runs, in order."""
    bodies: list[dict] = []
    urlopen, post = urllib.request.urlopen, requests.post

    def recording_urlopen(req, data=None, *args, **kwargs):
        if data is not None and getattr(req, "full_url", "").endswith("/generate"):
            bodies.append(json.loads(data))
        return urlopen(req, data, *args, **kwargs)

    def recording_post(url, *args, **kwargs):
        if url.endswith("/generate"):
            bodies.append(kwargs.get("json"))
        return post(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", recording_urlopen)
    monkeypatch.setattr(requests, "post", recording_post)
    return bodies


def _ridgefill_of(body: dict):
    return (body.get("sampling_params") or {}).get("custom_params", {}).get("ridgefill")


def _max_new_tokens(body: dict):
    return (body.get("sampling_params") or {}).get("max_new_tokens")


def test_fork_carries_the_parameters_and_reuses_the_namespace(frontend, endpoint, sent, tokenizer):
    sgl, _ = frontend
    header = "Document:\n" + _document("json") + "\n"

    @sgl.function
    def two_questions(s, header):
        s += header
        # SGLang's fork sends its prefix-caching request only if the parent's worker has already applied
        # the text; without this sync that is a race, and the request this test is about may not be sent.
        s.sync()
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f"Question {i + 1}: what does it define?\nAnswer:"
            f += sgl.gen("answer", max_tokens=4, temperature=0)
        forks.join()
        return [f.get_meta_info("answer") for f in forks]

    state = two_questions.run(header=header)
    metas = state.ret_value
    assert state.error() is None

    assert len(sent) == 3, [_max_new_tokens(b) for b in sent]
    assert all(_ridgefill_of(b) == PARAMS for b in sent), [_ridgefill_of(b) for b in sent]
    commits = [b for b in sent if _max_new_tokens(b) == 0]
    assert len(commits) == 1 and commits[0]["text"] == header  # the fork's prefix-caching request

    # Both branches find the whole prefix the commit cached in the RidgeFill namespace. They run
    # concurrently, so the first one scheduled can only have found it there, not in its sibling.
    header_tokens = len(tokenizer(header).input_ids)
    assert header_tokens > 200
    assert [m["cached_tokens"] for m in metas] == [header_tokens] * 2, metas

    # An exact request never sees the namespace: the same header, exact, finds nothing cached.
    @sgl.function
    def read(s, header):
        s += header + sgl.gen("word", max_tokens=1, temperature=0)

    with endpoint.ridgefill(enabled=False):
        exact = read.run(header=header)
    assert exact.get_meta_info("word")["cached_tokens"] == 0
    assert _ridgefill_of(sent[-1]) == {**PARAMS, "enabled": False}


def test_disabled_output_differs_from_ridgefill(frontend, endpoint, sent):
    sgl, fe = frontend
    text = "Document:\n" + _document("csv") + "\nSummary:"

    @sgl.function
    def summarise(s, text):
        s += text + sgl.gen("summary", max_tokens=6, temperature=0, return_logprob=True)

    # run() may return before the program's worker has sent anything (get_meta_info waits for it); the
    # worker took its context when the program started, inside the block.
    with endpoint.ridgefill(enabled=False):
        exact = summarise.run(text=text)
    exact_lp = [lp for lp, _, _ in exact.get_meta_info("summary")["output_token_logprobs"]]
    with fe.ridgefill(tail=12):
        filled = summarise.run(text=text)
    filled_lp = [lp for lp, _, _ in filled.get_meta_info("summary")["output_token_logprobs"]]
    assert [_ridgefill_of(b) for b in sent] == [{**PARAMS, "enabled": False}, {**PARAMS, "tail": 12}]
    assert len(exact_lp) == len(filled_lp) == 6
    # A random-weight model with maps away from the identity: filled KV moves the logits visibly.
    assert max(abs(a - b) for a, b in zip(exact_lp, filled_lp)) > 1e-3, (exact_lp, filled_lp)


def test_run_batch_prefix_cache_stream_and_select(frontend, endpoint, sent, tokenizer):
    sgl, _ = frontend
    instructions = INSTRUCTIONS + _document("string", 300) + "\n"

    @sgl.function
    def qa(s, question):
        s += instructions
        s += "Q: " + question + "\nA:"
        s += sgl.gen("a", max_tokens=3, temperature=0)

    questions = ["what is Template?", "what is capwords?"]
    # Contexts do not reach run_batch's threads; a derived endpoint does.
    batch = endpoint.with_ridgefill(tail=24)
    states = qa.run_batch([{"question": q} for q in questions], backend=batch)
    assert all(_ridgefill_of(b) == {**PARAMS, "tail": 24} for b in sent), [_ridgefill_of(b) for b in sent]
    prefix = [b for b in sent if _max_new_tokens(b) == 0]
    assert len(prefix) == 1 and prefix[0]["text"].startswith(instructions)  # run_batch's cache_prefix
    # A namespace request's cache match stops where its own tail starts (the tail always runs exactly).
    prompts = [len(tokenizer(instructions + "Q: " + q + "\nA:").input_ids) for q in questions]
    reusable = [min(len(tokenizer(instructions).input_ids), n - 24) for n in prompts]
    cached = [st.get_meta_info("a")["cached_tokens"] for st in states]
    assert all(c >= r > 100 for c, r in zip(cached, reusable)), (cached, reusable)

    sent.clear()

    @sgl.function
    def judge(s, question):
        s += instructions + "Q: " + question + "\nA:" + sgl.gen("a", max_tokens=3, temperature=0)
        s += "\nIs that right? " + sgl.select("verdict", choices=["yes", "no"])

    state = judge.run(question="what is Formatter?", stream=True)
    assert "".join(state.text_iter()).endswith(state["verdict"])
    assert state["verdict"] in ("yes", "no")
    assert [b.get("stream") for b in sent] == [True, None, None]
    assert isinstance(sent[-1]["text"], list)  # select scores both choices in one request
    assert all(_ridgefill_of(b) == PARAMS for b in sent), [_ridgefill_of(b) for b in sent]


def test_overrides_layer_and_a_stock_endpoint_is_untouched(frontend, endpoint, sent, server):
    _, fe = frontend
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    other = fe.RidgeFillEndpoint(server[1])
    assert other.ridgefill_params is None
    with fe.ridgefill(arm="identity"):
        with endpoint.ridgefill(seed=3):
            assert endpoint.ridgefill_params == {**PARAMS, "arm": "identity", "seed": 3}
            assert other.ridgefill_params == {"arm": "identity"}
        assert endpoint.ridgefill_params == {**PARAMS, "arm": "identity"}
    assert endpoint.ridgefill_params == PARAMS
    assert endpoint.with_ridgefill(enabled=False).ridgefill_params == {**PARAMS, "enabled": False}

    with endpoint.ridgefill(seed=5):
        RuntimeEndpoint(server[1]).cache_prefix("A stock endpoint sends its own body.")
    endpoint.cache_prefix("RidgeFill sends its parameters.")
    assert [_ridgefill_of(b) for b in sent] == [None, PARAMS]


def test_a_request_that_bypasses_the_seam_fails_loudly(frontend, endpoint, monkeypatch):
    from sglang.lang.backend import runtime_endpoint

    # An SGLang that posted some other way: the wrapped function is skipped entirely.
    monkeypatch.setattr(runtime_endpoint, "http_request", runtime_endpoint.http_request.__wrapped__)
    with pytest.raises(RuntimeError) as info:
        endpoint.cache_prefix("This request goes out without RidgeFill parameters.")
    assert str(info.value) == (
        "RidgeFillEndpoint.cache_prefix: SGLang's RuntimeEndpoint.cache_prefix posted no /generate request "
        "through sglang.lang.backend.runtime_endpoint.http_request, so the RidgeFill parameters were not attached"
    )


def test_bad_parameters_fail_before_any_request(frontend):
    _, fe = frontend
    unreachable = "http://127.0.0.1:9"  # a request there would fail differently
    with pytest.raises(ValueError) as info:
        fe.RidgeFillEndpoint(unreachable, ridgefill={"tail": -1})
    assert str(info.value) == (
        "RidgeFillEndpoint(ridgefill={'tail': -1}): custom_params[\"ridgefill\"][\"tail\"] must be in [1, 2147483647], got -1"
    )
    with pytest.raises(ValueError) as info:
        fe.RidgeFillEndpoint(unreachable, ridgefill={"arm": "ridgefill", "tial": 16})
    assert str(info.value) == (
        "RidgeFillEndpoint(ridgefill={'arm': 'ridgefill', 'tial': 16}): custom_params[\"ridgefill\"] has unknown "
        "key(s) 'tial'; known keys: arm, control, enabled, exact_every, exact_rows, policy, seed, splice, split, tail, "
        "value_rescale, watch_rows"
    )
    with pytest.raises(ValueError) as info:
        fe.RidgeFillEndpoint(unreachable, ridgefill=3)
    assert str(info.value) == (
        "RidgeFillEndpoint(ridgefill=3): expected a mapping, a boolean or an arm or policy name, got 3"
    )
    with pytest.raises(ValueError) as info:
        fe.RidgeFillEndpoint(unreachable, extra_key="tenant|rf:x")
    assert str(info.value) == (
        "RidgeFillEndpoint(extra_key='tenant|rf:x'): expected a string without '|rf:' "
        "(reserved for RidgeFill's cache namespace)"
    )
    with pytest.raises(ValueError) as info:
        with fe.ridgefill(arm="fast"):
            pass
    assert str(info.value) == (
        "ridgefill(arm='fast'): custom_params[\"ridgefill\"][\"arm\"] must be one of ridgefill, identity, nofill, "
        "exact, got 'fast'"
    )


def test_a_missing_seam_fails_at_construction(frontend, monkeypatch):
    from sglang.lang.backend import runtime_endpoint

    _, fe = frontend
    monkeypatch.delattr(runtime_endpoint, "http_request")
    with pytest.raises(RuntimeError) as info:
        fe.RidgeFillEndpoint("http://127.0.0.1:9", ridgefill=PARAMS)
    assert str(info.value) == (
        "sglang.lang.backend.runtime_endpoint.http_request is missing, so RidgeFillEndpoint cannot attach its "
        "parameters; this SGLang version posts requests differently from the one sgl-ridgefill supports"
    )
