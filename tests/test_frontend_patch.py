"""The client-side patch behind ``RidgeFillEndpoint`` (``patches.wrap_http_request``), without a server.

SGLang's ``http_request`` is replaced by a recorder that answers like a server, so these tests see the
bodies the frontend would post. ``tests/engine/test_frontend.py`` runs the same path against a real server.
"""

from __future__ import annotations

import json

import pytest

PARAMS = {"arm": "ridgefill", "tail": 16}


class _Reply:
    status_code = 200

    def json(self):
        return {"model_path": "stub-model"}


@pytest.fixture
def posted(monkeypatch):
    """Replace ``runtime_endpoint.http_request`` by a recorder; yields the (url, body) pairs it received."""
    from sglang.lang.backend import runtime_endpoint

    calls: list[tuple[str, object]] = []

    def http_request(url, json=None, stream=False, api_key=None, verify=None, method=None):
        calls.append((url, json))
        return _Reply()

    monkeypatch.setattr(runtime_endpoint, "http_request", http_request)
    return calls


def test_the_wrapper_passes_every_body_through_stamp_once_per_process(posted):
    from sglang.lang.backend import runtime_endpoint

    from sgl_ridgefill import patches

    recorder = runtime_endpoint.http_request
    patches.wrap_http_request(lambda url, body: {**body, "seen": url} if isinstance(body, dict) else body)
    wrapped = runtime_endpoint.http_request
    assert wrapped is not recorder and wrapped.__wrapped__ is recorder
    patches.wrap_http_request(lambda url, body: pytest.fail("a second wrap must be a no-op"))
    assert runtime_endpoint.http_request is wrapped

    body = {"text": "x"}
    wrapped("http://h/generate", json=body)
    wrapped("http://h/generate", {"text": "y"})
    wrapped("http://h/get_model_info")
    assert posted == [
        ("http://h/generate", {"text": "x", "seen": "http://h/generate"}),
        ("http://h/generate", {"text": "y", "seen": "http://h/generate"}),
        ("http://h/get_model_info", None),
    ]
    assert body == {"text": "x"}  # the caller's dict is not edited


def test_a_missing_target_is_refused(monkeypatch):
    from sglang.lang.backend import runtime_endpoint

    from sgl_ridgefill import patches

    monkeypatch.delattr(runtime_endpoint, "http_request")
    with pytest.raises(RuntimeError) as info:
        patches.wrap_http_request(lambda url, body: body)
    assert str(info.value) == (
        "sglang.lang.backend.runtime_endpoint.http_request is missing, so RidgeFillEndpoint cannot attach its "
        "parameters; this SGLang version posts requests differently from the one sgl-ridgefill supports"
    )
    assert patches.CLIENT_TARGETS == (patches.HTTP_REQUEST,) == ("sglang.lang.backend.runtime_endpoint.http_request",)


def test_the_first_endpoint_installs_it_and_stamps_only_its_own_requests(posted):
    from sglang.lang.backend import runtime_endpoint
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    from sgl_ridgefill.frontend import RidgeFillEndpoint

    recorder = runtime_endpoint.http_request
    endpoint = RidgeFillEndpoint("http://h", ridgefill=PARAMS, extra_key="tenant")
    assert runtime_endpoint.http_request.__wrapped__ is recorder
    endpoint.cache_prefix("shared prefix")
    RuntimeEndpoint("http://h").cache_prefix("stock")
    generate = [body for url, body in posted if url == "http://h/generate"]
    assert json.loads(json.dumps(generate)) == [
        {"text": "shared prefix", "sampling_params": {"max_new_tokens": 0, "custom_params": {"ridgefill": PARAMS}},
         "extra_key": "tenant"},
        {"text": "stock", "sampling_params": {"max_new_tokens": 0}},
    ]
