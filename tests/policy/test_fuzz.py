"""Whatever the input, parsing and compiling raise PolicyError and nothing else."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_ridgefill.policy import PolicyError, builtin_policy_names, compile_policy, format_policy, parse_policy
from sgl_ridgefill.policy.strategies import PIECES, mutated_shipped, policies

from .helpers import deployment_for

FUZZ = settings(max_examples=250, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _check(text: str) -> None:
    try:
        policy = parse_policy(text, "fuzz.rfpolicy")
    except PolicyError as err:
        assert str(err)
        return
    assert parse_policy(format_policy(policy)) == policy
    model, maps = deployment_for(policy.name if policy.name in builtin_policy_names() else "llama-3.1-8b")
    for targets in ({}, {"maps": maps, "model": model}):
        try:
            compiled = compile_policy(policy, **targets)
        except PolicyError as err:
            assert str(err)
        else:
            assert len(compiled.identity) == 16


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text):
    _check(text)


@FUZZ
@given(st.booleans(), st.lists(st.sampled_from(PIECES), max_size=40).map(" ".join))
def test_random_token_sequences(framed, text):
    _check(f'policy "p" {{ {text} }}' if framed else text)


@FUZZ
@given(mutated_shipped())
def test_mutated_shipped_policies(text):
    _check(text)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies)
def test_compiling_generated_trees(policy):
    model, maps = deployment_for("qwen3.8-27b")
    for targets in ({}, {"maps": maps, "model": model}):
        try:
            compile_policy(parse_policy(format_policy(policy)), **targets)
        except PolicyError:
            pass


def test_deep_nesting_is_refused_not_crashed():
    deep = 'policy "p" { select ' + "(" * 5000 + "a()" + ")" * 5000 + " }"
    assert parse_policy(deep).statements[0].rows.name == "a"
    chain = 'policy "p" { select ' + " | ".join(["a()"] * 150) + " }"
    try:
        parse_policy(chain)
    except PolicyError as err:
        assert "nests more than 100 levels deep" in str(err)
    else:
        raise AssertionError("a 150-deep expression parsed")
    lists = 'policy "p" { correct x(a=' + "[" * 300 + "]" * 300 + ") }"
    try:
        parse_policy(lists)
    except PolicyError as err:
        assert "nests more than 100 levels deep" in str(err)
    else:
        raise AssertionError("a 300-deep list parsed")
