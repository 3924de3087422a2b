"""Request admission: which values win, and which requests are refused or run exactly (no engine needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, parse_policy
from sgl_ridgefill.request_params import RequestParamError
from sgl_ridgefill.runtime.runtime import RidgeFillRuntime

MODEL = ModelInfo(num_layers=24, attention_layers=tuple(range(24)), recurrent_layers=(), has_qk_norm=False)
MAPS = MapsInfo(splits=(12, 16), default_split=12, num_layers=24)


def _policy(text: str):
    return compile_policy(parse_policy(text), maps=MAPS, model=MODEL)


SERVER_POLICY = _policy('policy "server" { split 16 tail 2048 select attention_topk(q=64, share=10%) }')
NAMED = _policy('policy "named" { arm identity split 12 tail 512 cache namespace }')


def _runtime(**cfg) -> RidgeFillRuntime:
    adapter = SimpleNamespace(shape=SimpleNamespace(num_layers=24))
    maps = SimpleNamespace(splits=(12, 16), folder=SimpleNamespace(manifest={"files": {"a": "1"}}, path="m"))
    return RidgeFillRuntime(
        ServerConfig(prefill_backend="ridgefill", maps="m", **cfg), adapter, maps=maps, policy=SERVER_POLICY,
        policies={"named": NAMED, "server": SERVER_POLICY}, default_split=12,
    )


def plan(rt, params, n=4096, **kw):
    return rt.plan_request("r", {"ridgefill": params} if params is not None else None, list(range(n)), **kw)


def test_server_policy_applies_by_default():
    p = plan(_runtime(), None)
    assert (p.arm, p.split, p.tail, p.cache_mode) == ("ridgefill", 16, 2048, "no_insert")
    assert p.policy is SERVER_POLICY and p.has_selection


def test_server_flags_override_the_server_policy():
    p = plan(_runtime(tail=1024), None)
    assert (p.split, p.tail) == (16, 1024)


def test_named_policy_wins_over_server_flags_and_request_values_win_over_everything():
    rt = _runtime(tail=1024, arm="ridgefill")
    p = plan(rt, {"policy": "named"})
    assert (p.arm, p.split, p.tail, p.cache_mode) == ("identity", 12, 512, "namespace")
    p = plan(rt, {"policy": "named", "tail": 64})
    assert p.tail == 64


def test_exact_requests_have_no_plan():
    rt = _runtime()
    assert plan(rt, {"enabled": False}) is None
    assert plan(rt, "exact") is None
    assert plan(rt, {"split": 24}) is None  # S = L: nothing above the split


def test_unsupported_request_runs_exact():
    assert plan(_runtime(), {}, unsupported="input_embeds") is None


def test_prompt_logprobs_are_served_from_the_tail_only():
    """Filled rows have no output: a request wanting their logprobs runs exact; the tail's are served."""
    rt = _runtime()
    assert plan(rt, {"tail": 1024}, logprob_start=4096 - 1024).logprob_start == 3072
    assert plan(rt, {"tail": 1024}, logprob_start=3071) is None


def test_splice_is_a_diagnostic_of_the_filled_arms():
    assert plan(_runtime(), {"splice": "keys"}).splice == "keys"
    assert plan(_runtime(), {"splice": "keys"}).namespace != plan(_runtime(), {}).namespace
    with pytest.raises(RequestParamError, match="the nofill arm has none"):
        plan(_runtime(), {"arm": "nofill", "splice": "values"})


@pytest.mark.parametrize(
    "params, message",
    [
        ({"split": 13}, "the maps folder has splits [12, 16], not 13"),
        ({"split": 30}, "split 30 is outside 1..24 for this 24-layer model"),
        ({"policy": "nope"}, "unknown policy 'nope'; this server has named, server"),
        ({"arm": "nofill", "value_rescale": 64}, "value_rescale needs filled values; the nofill arm has none"),
    ],
)
def test_refused(params, message):
    with pytest.raises(RequestParamError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan(_runtime(), params)


def test_namespace_is_a_function_of_everything_that_changes_filled_kv():
    rt = _runtime()
    a, b, c = plan(rt, {}), plan(rt, {}), plan(rt, {"tail": 100})
    assert a.namespace == b.namespace != c.namespace
