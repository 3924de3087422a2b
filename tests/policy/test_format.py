"""Canonical formatting: exact output, and parse(fmt(x)) == x."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from sgl_ridgefill.policy import builtin_policy_names, builtin_policy_path, format_policy, parse_policy
from sgl_ridgefill.policy.strategies import policies

from .helpers import parse

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


COMMENTED = """# head one
# head two
policy "p" { # after the brace
  # before arm
  arm ridgefill  # trailing arm
  split 12 # trailing split
  tail 4096
  # between, first
  # between, second
  select probe(rows=256) # inside select, end of its first line
    budget 10% # inside select, a later line
    # inside select, its own line
    plus digits()
  # before correct
  correct terminal_state(offsets="a#b") cache no_insert  # trails cache, the last on its line
  # footer one
  # footer two
} # after the closing brace
# tail
"""

COMMENTED_CANONICAL = """# head one
# head two
policy "p" {
  # after the brace
  # before arm
  arm ridgefill  # trailing arm
  split 12  # trailing split
  tail 4096
  # between, first
  # between, second
  # inside select, end of its first line
  # inside select, a later line
  # inside select, its own line
  select probe(rows=256)
    budget 10%
    plus digits()
  # before correct
  correct terminal_state(offsets="a#b")
  cache no_insert  # trails cache, the last on its line
  # footer one
  # footer two
}
# after the closing brace
# tail
"""


def test_comments_attach_before_after_between_and_inside_statements():
    assert format_policy(parse(COMMENTED)) == COMMENTED_CANONICAL
    assert format_policy(parse(COMMENTED_CANONICAL)) == COMMENTED_CANONICAL
    assert format_policy(parse('policy "p" { # only a comment\n}')) == 'policy "p" {\n  # only a comment\n}\n'
    assert format_policy(parse('policy "p" {} # after\n')) == 'policy "p" {\n}\n# after\n'


def test_many_comments_and_statements():
    # 3,000 statements, each with a comment above and one after it: every comment stays where it was.
    body = "".join(f"  # above {i}\n  tail {i + 1}  # after {i}\n" for i in range(3000))
    text = f'policy "p" {{\n{body}}}\n'
    policy = parse(text)
    assert [(s.leading[0].text, s.trailing.text) for s in policy.statements] == [
        (f" above {i}", f" after {i}") for i in range(3000)
    ]
    assert format_policy(policy) == text


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
