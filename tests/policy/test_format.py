"""Canonical formatting: exact output, and parse(fmt(x)) == x."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sgl_ridgefill.policy import builtin_policy_names, builtin_policy_path, format_policy, parse_policy

from .helpers import parse
from .strategies import policies

MESSY = """# head
policy   "p"{arm ridgefill # the arm
split 12 tail 4096
select (probe(rows=256,)) budget 1. * size((top(protected_classes(), 50.0%)|digits())|attention_topk(q=64,share=20%))
reserve lexical_net() up to 5% plus special_tokens()
correct value_rescale(c=512) cache no_insert
    # bottom
}"""

CANONICAL = """# head
policy "p" {
  arm ridgefill  # the arm
  split 12
  tail 4096
  select probe(rows=256)
    budget 1.0 * size(top(protected_classes(), 50%) | digits() | attention_topk(q=64, share=20%))
    reserve lexical_net() up to 5%
    plus special_tokens()
  correct value_rescale(c=512)
  cache no_insert
  # bottom
}
"""


def test_canonical_text():
    assert format_policy(parse(MESSY)) == CANONICAL
    assert format_policy(parse(CANONICAL)) == CANONICAL


def test_parentheses_only_where_the_tree_needs_them():
    def fmt_rows(rows):
        return format_policy(parse(f'policy "p" {{ select {rows} }}')).splitlines()[1]

    assert fmt_rows("a() - (b() - c())") == "  select a() - (b() - c())"
    assert fmt_rows("(a() - b()) | c()") == "  select (a() - b()) | c()"
    assert fmt_rows("a() - b() | c()") == "  select (a() - b()) | c()"
    assert fmt_rows("a() | b() & c()") == "  select a() | (b() & c())"
    assert fmt_rows("((a() | b()) | c())") == "  select a() | b() | c()"


def test_comments_can_be_dropped():
    assert format_policy(parse(MESSY), comments=False).count("#") == 0


def test_every_shipped_policy_is_canonical_and_round_trips():
    for name in builtin_policy_names():
        text = builtin_policy_path(name).read_text(encoding="utf-8")
        policy = parse_policy(text, name)
        assert format_policy(policy) == text, name
        assert parse_policy(format_policy(policy)) == policy


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies)
def test_round_trip_of_generated_trees(policy):
    text = format_policy(policy)
    assert parse_policy(text) == policy
    assert format_policy(parse_policy(text)) == text
