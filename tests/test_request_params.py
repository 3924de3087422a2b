from __future__ import annotations

import pytest

from sgl_ridgefill.request_schema import RequestParamError, RequestParams, parse_request_params


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
        ({"tail": 2**31 - 1, "seed": 2**63 - 1, "split": 1024},
         RequestParams(tail=2**31 - 1, seed=2**63 - 1, split=1024)),
        ({"tail": None, "enabled": None}, RequestParams()),  # null is the same as leaving the key out
        ("p" * 200, RequestParams(policy="p" * 200)),
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
        ({"tail": 0}, 'custom_params["ridgefill"]["tail"] must be in [1, 2147483647], got 0'),
        ({"tail": -1}, 'custom_params["ridgefill"]["tail"] must be in [1, 2147483647], got -1'),
        # L1: 2**64 and up raised OverflowError in SGLang's msgspec send (HTTP 500); now a 400 naming the bound
        ({"tail": 2**64}, 'custom_params["ridgefill"]["tail"] must be in [1, 2147483647], got 18446744073709551616'),
        ({"seed": 2**63}, 'custom_params["ridgefill"]["seed"] must be in [0, 9223372036854775807], got '
                          "9223372036854775808"),
        ({"split": 10**5000}, 'custom_params["ridgefill"]["split"] must be in [1, 1024], got an integer too long to print'),
        ({"split": 1025}, 'custom_params["ridgefill"]["split"] must be in [1, 1024], got 1025'),
        ({"value_rescale": -1}, 'custom_params["ridgefill"]["value_rescale"] must be in [0, 2147483647], got -1'),
        ({"policy": ""}, 'custom_params["ridgefill"]["policy"] must be a policy name, got \'\''),
        ({"policy": 7}, 'custom_params["ridgefill"]["policy"] must be a policy name, got 7'),
        ({"policy": "p" * 201}, 'custom_params["ridgefill"]["policy"] must be a policy name of at most 200 '
                                "characters, got 201"),
        ("q" * 201, 'custom_params["ridgefill"]["policy"] must be a policy name of at most 200 characters, got 201'),
        ({"arm": "x" * 1000}, 'custom_params["ridgefill"]["arm"] must be one of ridgefill, identity, nofill, exact, '
                              "got '" + "x" * 78 + "…"),
        ({1: 2, "b": 3}, "custom_params[\"ridgefill\"] has unknown key(s) 'b', 1; known keys: arm, control, enabled, "
                         "exact_every, exact_rows, policy, seed, splice, split, tail, value_rescale, watch_rows"),
        ({f"k{i}": 0 for i in range(7)}, "custom_params[\"ridgefill\"] has unknown key(s) 'k0', 'k1', 'k2', 'k3', "
                                          "'k4' and 2 more; known keys: arm, control, enabled, exact_every, exact_rows, policy, "
                                          "seed, splice, split, tail, value_rescale, watch_rows"),
        ({"split": "12"}, 'custom_params["ridgefill"]["split"] must be an integer, got \'12\''),
        ({"split": True}, 'custom_params["ridgefill"]["split"] must be an integer, got True'),
        ({"enabled": "no"}, 'custom_params["ridgefill"]["enabled"] must be true or false, got \'no\''),
        ({"control": "shuffle"}, 'custom_params["ridgefill"]["control"] must be one of none, random, got \'shuffle\''),
        ({"tial": 3}, "custom_params[\"ridgefill\"] has unknown key(s) 'tial'; known keys: arm, control, enabled, "
                      "exact_every, exact_rows, policy, seed, splice, split, tail, value_rescale, watch_rows"),
        ({"splice": "queries"}, 'custom_params["ridgefill"]["splice"] must be one of keys, values, both, key_norm, '
                                "optionally followed by @FIRST-LAST upper layers (e.g. keys@13-17), got 'queries'"),
        (3, 'custom_params["ridgefill"] must be an object, a boolean or an arm name, got 3'),
    ],
)
def test_invalid_messages(raw, message):
    with pytest.raises(RequestParamError) as e:
        parse_request_params({"ridgefill": raw})
    assert str(e.value) == message
