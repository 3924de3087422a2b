from __future__ import annotations

import pytest

from sgl_ridgefill.request_params import RequestParamError, RequestParams, parse_request_params


def test_absent_means_server_default():
    assert parse_request_params(None) is None
    assert parse_request_params({"other": 1}) is None
    assert parse_request_params({"ridgefill": None}) is None


@pytest.mark.parametrize(
    "raw, expected",
    [
        (False, RequestParams(enabled=False)),
        (True, RequestParams()),
        ("identity", RequestParams(arm="identity")),
        ("qwen2.5-0.5b-default", RequestParams(policy="qwen2.5-0.5b-default")),
        ({"arm": "nofill", "tail": 64, "seed": 3}, RequestParams(arm="nofill", tail=64, seed=3)),
        ({"exact_every": 5, "control": "random"}, RequestParams(exact_every=5, control="random")),
        ({"value_rescale": 0}, RequestParams(value_rescale=0)),
        ({"splice": "key_norm"}, RequestParams(splice="key_norm")),
    ],
)
def test_valid(raw, expected):
    assert parse_request_params({"ridgefill": raw}) == expected


def test_exact_wishes():
    assert parse_request_params({"ridgefill": {"enabled": False}}).wants_exact
    assert parse_request_params({"ridgefill": {"arm": "exact"}}).wants_exact
    assert not parse_request_params({"ridgefill": {}}).wants_exact


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"arm": "bogus"}, 'custom_params["ridgefill"]["arm"] must be one of ridgefill, identity, nofill, exact, got \'bogus\''),
        ({"tail": 0}, 'custom_params["ridgefill"]["tail"] must be >= 1, got 0'),
        ({"split": "12"}, 'custom_params["ridgefill"]["split"] must be an integer, got \'12\''),
        ({"split": True}, 'custom_params["ridgefill"]["split"] must be an integer, got True'),
        ({"enabled": "no"}, 'custom_params["ridgefill"]["enabled"] must be true or false, got \'no\''),
        ({"control": "shuffle"}, 'custom_params["ridgefill"]["control"] must be one of none, random, got \'shuffle\''),
        ({"tial": 3}, "custom_params[\"ridgefill\"] has unknown key(s) 'tial'; known keys: arm, control, enabled, "
                      "exact_every, policy, seed, splice, split, tail, value_rescale"),
        ({"splice": "queries"}, 'custom_params["ridgefill"]["splice"] must be one of keys, values, both, key_norm, '
                                "got 'queries'"),
        (3, 'custom_params["ridgefill"] must be an object, a boolean or an arm name, got 3'),
    ],
)
def test_invalid_messages(raw, message):
    with pytest.raises(RequestParamError) as e:
        parse_request_params({"ridgefill": raw})
    assert str(e.value) == message
