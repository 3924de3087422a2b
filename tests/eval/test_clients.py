"""The stock check and the offline-engine client, against fake backends (no SGLang)."""

from __future__ import annotations

import pytest

from sgl_ridgefill.tools.client import ServerError
from sgl_ridgefill.eval.engine_client import EngineClient
from sgl_ridgefill.eval.runner import fingerprints, stock_check

PROMPTS = [[1, 2, 3], [4, 5, 6, 7]]


class FakeBackend:
    """Answers every prompt with its reversed ids; ``differ`` names the custom params whose answer is off."""

    def __init__(self, differ=None):
        self.differ = differ
        self.bodies, self.flushes = [], 0

    def flush_cache(self):
        self.flushes += 1

    def generate(self, body):
        self.bodies.append(body)
        custom = body["sampling_params"].get("custom_params")
        ids = list(reversed(body["input_ids"]))
        if custom is not None and custom == self.differ:
            ids[0] += 1
        return {"text": "x", "output_ids": ids, "meta_info": {"completion_tokens": len(ids)}}


def test_stock_check_passes_on_identical_answers_and_flushes_before_each():
    rf = FakeBackend()
    check = stock_check(rf, fingerprints(FakeBackend(), PROMPTS), PROMPTS)
    assert check["passed"] and check["mismatches"] == [] and check["prompts"] == 2
    assert rf.flushes == len(rf.bodies) == 4  # enabled=false and arm=exact, each prompt
    assert {str(b["sampling_params"]["custom_params"]) for b in rf.bodies} == {
        "{'ridgefill': {'enabled': False}}", "{'ridgefill': 'exact'}"}
    assert all(b["return_logprob"] and b["logprob_start_len"] == 0 for b in rf.bodies)


def test_stock_check_names_each_mismatch():
    rf = FakeBackend(differ={"ridgefill": "exact"})
    check = stock_check(rf, fingerprints(FakeBackend(), PROMPTS), PROMPTS)
    assert not check["passed"]
    assert check["mismatches"] == ["prompt 0 (3 tokens), arm=exact", "prompt 1 (4 tokens), arm=exact"]


class FakeEngine:
    def __init__(self, answer=None, error=None):
        self.answer, self.error, self.calls, self.flushed = answer, error, [], 0

    def flush_cache(self):
        self.flushed += 1

    def generate(self, **kwargs):
        self.calls.append(kwargs)
        if self.error:
            raise self.error
        return self.answer


def test_engine_client_passes_the_generate_body_as_keywords():
    engine = FakeEngine(answer={"text": "ok", "meta_info": {"finish_reason": {"type": "length"}}})
    client = EngineClient(engine, "RidgeFill engine")
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
            "logprob_start_len": 1, "top_logprobs_num": 20}
    assert client.generate(body)["text"] == "ok"
    assert engine.calls == [{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
                             "logprob_start_len": 1, "top_logprobs_num": 20}]
    client.flush_cache()
    assert engine.flushed == 1
    with pytest.raises(ValueError, match="unsupported field\\(s\\) stream"):
        client.generate({**body, "stream": True})


def test_engine_client_turns_refusals_and_aborts_into_server_errors():
    refused = EngineClient(FakeEngine(error=ValueError('custom_params["ridgefill"]["tail"] must be >= 1')), "RF")
    with pytest.raises(ServerError, match=r"RF: ValueError: .*tail.* must be >= 1"):
        refused.generate({"input_ids": [1], "sampling_params": {}})
    aborted = EngineClient(FakeEngine(answer={"meta_info": {"finish_reason": {"type": "abort", "message": "too long"}}}), "RF")
    with pytest.raises(ServerError, match="RF: request aborted: too long"):
        aborted.generate({"input_ids": [1], "sampling_params": {}})
