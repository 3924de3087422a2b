"""The one declaration of the request keys, and everything derived from it."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys

import pytest

from sgl_ridgefill import request_schema as schema
from sgl_ridgefill.request_schema import RequestParamError, RequestParams, parse_request_params, refuse_diagnostics
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.settings import SETTINGS

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _parse(fields):
    return parse_request_params({"ridgefill": fields})


def test_request_params_has_one_field_per_key_with_its_default():
    assert [(f.name, f.default) for f in dataclasses.fields(RequestParams)] == [
        (k.name, k.default) for k in schema.REQUEST_KEYS
    ]


def test_the_declared_attributes():
    keys = schema.KEYS_BY_NAME
    assert [k.name for k in schema.REQUEST_KEYS if k.diagnostic] == [
        "exact_every", "control", "seed", "splice", "exact_rows", "watch_rows"]
    assert keys["arm"].diagnostic_choices == {"identity", "nofill"} and not keys["arm"].diagnostic
    # what changes the filled KV; the keys that only choose exact rows share a namespace (row-exact reuse)
    assert schema.namespace_fields() == ("arm", "split", "tail", "value_rescale", "splice")
    assert [(k.name, k.lo, k.hi) for k in schema.REQUEST_KEYS if isinstance(k, schema.IntKey)] == [
        ("split", 1, 1024), ("tail", 1, 2**31 - 1), ("exact_every", 1, 2**31 - 1), ("value_rescale", 0, 2**31 - 1),
        ("seed", 0, 2**63 - 1),
    ]


@pytest.mark.parametrize("key", [k for k in schema.REQUEST_KEYS if isinstance(k, schema.IntKey)], ids=lambda k: k.name)
def test_every_integer_key_is_parsed_with_its_bounds(key):
    assert getattr(_parse({key.name: key.lo}), key.name) == key.lo
    assert getattr(_parse({key.name: key.hi}), key.name) == key.hi
    for bad in (key.lo - 1, key.hi + 1, 2**64):
        with pytest.raises(RequestParamError) as e:
            _parse({key.name: bad})
        assert str(e.value) == f'custom_params["ridgefill"]["{key.name}"] must be in [{key.lo}, {key.hi}], got {bad}'


@pytest.mark.parametrize("key", [k for k in schema.REQUEST_KEYS if isinstance(k, schema.EnumKey)], ids=lambda k: k.name)
def test_every_enum_key_takes_exactly_its_choices(key):
    for choice in key.choices:
        assert getattr(_parse({key.name: choice}), key.name) == choice
    with pytest.raises(RequestParamError, match=re.escape(f"must be one of {', '.join(key.choices)}, got 'bogus'")):
        _parse({key.name: "bogus"})


def test_unknown_key_error_lists_every_declared_key():
    with pytest.raises(RequestParamError) as e:
        _parse({"nope": 1})
    assert str(e.value).endswith("known keys: " + ", ".join(sorted(schema.key_names())))


def test_shorthands():
    assert _parse(False) == RequestParams(enabled=False)
    assert all(_parse(arm) == RequestParams(arm=arm) for arm in schema.ARMS)
    assert _parse("my-policy") == RequestParams(policy="my-policy")
    assert schema.expand_shorthand({"tail": 3}) == {"tail": 3}


@pytest.mark.parametrize(
    "fields, used",
    [
        ({}, []),
        ({"arm": "ridgefill", "tail": 64, "split": 3, "value_rescale": 0, "policy": "p", "enabled": True}, []),
        ({"arm": "exact"}, []),
        ({"control": "none", "seed": 0}, []),  # the defaults change nothing
        ({"arm": "identity"}, ['arm="identity"']),
        ({"arm": "nofill", "splice": "keys", "exact_every": 1, "control": "random", "seed": 3},
         ['arm="nofill"', "exact_every=1", 'control="random"', "seed=3", 'splice="keys"']),
    ],
)
def test_diagnostic_keys_used(fields, used):
    assert schema.diagnostic_keys_used(_parse(fields)) == used


_EXAMPLES = {schema.SpliceKey: ["keys", "values@13-17"], schema.RowsKey: [[0, 5, 9]]}


def test_every_diagnostic_key_is_detected():
    for key in schema.REQUEST_KEYS:
        values = key.diagnostic_choices if isinstance(key, schema.EnumKey) and not key.diagnostic else ()
        if key.diagnostic:
            if type(key) in _EXAMPLES:
                values = _EXAMPLES[type(key)]
            else:
                values = [c for c in key.choices if c != key.default] if isinstance(key, schema.EnumKey) else [key.hi]
        for value in values:
            assert schema.diagnostic_keys_used(_parse({key.name: value})), (key.name, value)


def test_refuse_diagnostics_names_them_all_and_the_flag():
    refuse_diagnostics(None)
    refuse_diagnostics(_parse({"arm": "ridgefill", "tail": 8}))
    with pytest.raises(RequestParamError) as e:
        refuse_diagnostics(_parse({"arm": "identity", "splice": "both"}))
    assert str(e.value) == (
        'custom_params["ridgefill"] uses diagnostic setting(s) arm="identity", splice="both"; this server accepts '
        "them only when started with --ridgefill-diagnostics"
    )


def _plan(**kw) -> RequestPlan:
    return RequestPlan(**{"arm": "ridgefill", "split": 4, "tail": 16, "maps_id": "m", **kw})


def _another(key: schema.RequestKey, value):
    if isinstance(key, schema.EnumKey):
        return next(c for c in key.choices if c not in (value, "exact"))  # a plan never has the exact arm
    if type(key) in _EXAMPLES:
        return next(v for v in _EXAMPLES[type(key)] if v != value)
    return (value or 0) + 1 if (value or 0) + 1 <= key.hi else key.lo


def test_every_namespace_field_is_a_plan_field():
    plan_fields = {f.name for f in dataclasses.fields(RequestPlan)}
    assert set(schema.namespace_fields()) <= plan_fields


@pytest.mark.parametrize("name", schema.namespace_fields())
def test_changing_any_namespace_field_changes_the_namespace(name):
    base = _plan()
    changed = dataclasses.replace(base, **{name: _another(schema.KEYS_BY_NAME[name], getattr(base, name))})
    assert changed.namespace != base.namespace
    assert dataclasses.replace(base).namespace == base.namespace


def test_namespace_also_covers_maps_and_policy_identity_but_not_the_rest():
    base = _plan()
    assert dataclasses.replace(base, maps_id="other").namespace != base.namespace
    policy = type("P", (), {"identity": "abc", "has_selection": lambda self: True})()
    assert dataclasses.replace(base, policy=policy).namespace != base.namespace
    for name, value in (("cache_mode", "namespace"), ("policy_name", "x")):
        assert dataclasses.replace(base, **{name: value}).namespace == base.namespace


def test_readme_has_the_generated_key_table():
    assert schema.request_keys_markdown() in README.read_text()


def test_markdown_has_a_row_per_key():
    rows = schema.request_keys_markdown().splitlines()[2:]
    assert [r.split("|")[1].strip() for r in rows] == [f"`{k.name}`" for k in schema.REQUEST_KEYS]


def test_module_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "sgl_ridgefill.request_schema", "--markdown"], check=True,
                         capture_output=True, text=True).stdout
    assert out == schema.request_keys_markdown()


def test_flags_named_in_the_docs_exist():
    flags = {s.flag for s in SETTINGS}
    named = {f for k in schema.REQUEST_KEYS for f in re.findall(r"--[a-z][a-z-]+", k.doc)}
    named |= {f for s in SETTINGS for f in re.findall(r"--[a-z][a-z-]+", s.help)}
    assert named and named <= flags


@pytest.mark.parametrize("value, parsed", [("keys", ("keys", None)), ("both@13-17", ("both", (13, 17))), ("values@5", ("values", (5, 5)))])
def test_splice_takes_an_optional_layer_range(value, parsed):
    assert schema.parse_splice(_parse({"splice": value}).splice) == parsed


@pytest.mark.parametrize("value", ["keys@", "keys@17-13", "keys@a-b", "rows", "keys@1-2-3", 3])
def test_a_bad_splice_is_refused(value):
    with pytest.raises(RequestParamError, match=r"must be one of keys, values, both, key_norm, optionally followed by @FIRST-LAST"):
        _parse({"splice": value})


def test_exact_rows_are_sorted_unique_positions():
    assert _parse({"exact_rows": [9, 3, 9, 0]}).exact_rows == (0, 3, 9)
    for bad in ([-1], [1.5], [True], "1,2", [0] * (schema.MAX_EXACT_ROWS + 1)):
        with pytest.raises(RequestParamError, match=r'\["exact_rows"\] must be a list of at most 65536 prompt positions'):
            _parse({"exact_rows": bad})


def test_a_request_key_without_its_plan_field_fails_the_import_check():
    from sgl_ridgefill.runtime.plan import check_carried_keys

    check_carried_keys()  # the shipped schema and plan agree
    extra = schema.IntKey(name="new_knob", doc="a key added to the schema alone", lo=0, hi=3)
    with pytest.raises(AssertionError, match="request key 'new_knob' has no RequestPlan field"):
        check_carried_keys((*schema.REQUEST_KEYS, extra))
    changed = dataclasses.replace(schema.KEYS_BY_NAME["control"], default="random")
    with pytest.raises(AssertionError, match="request key 'control' defaults to 'random', its RequestPlan field to 'none'"):
        check_carried_keys((changed,))
