"""``split S from N tokens``: a deeper split for long prompts, parsed, formatted, checked and resolved."""

from __future__ import annotations

import pytest

from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, format_policy
from sgl_ridgefill.policy.ast import IntLit, SplitStmt

from .helpers import error, parse

MAPS = MapsInfo((12, 14, 16), 12, 24)
MODEL = ModelInfo.dense(24)
TWO = 'policy "p" {\n  split 12\n  split 14 from 12288 tokens\n  split 16 from 32768 tokens\n}\n'


def c(text, **targets):
    return compile_policy(parse(text), **targets)


def test_parses_into_split_statements_with_their_threshold():
    statements = parse(TWO).statements
    assert statements == (
        SplitStmt(IntLit(12)),
        SplitStmt(IntLit(14), from_tokens=IntLit(12288)),
        SplitStmt(IntLit(16), from_tokens=IntLit(32768)),
    )
    assert statements[1].from_tokens.span.line == 3


def test_formats_canonically_and_round_trips():
    messy = 'policy "p" { split 12 split   14 from 12288\n tokens split 16 from 32768 tokens }'
    assert format_policy(parse(messy)) == TWO
    assert parse(format_policy(parse(TWO))) == parse(TWO)


def test_the_longest_threshold_a_prompt_reaches_picks_its_split():
    p = c(TWO, maps=MAPS, model=MODEL)
    assert p.split == 12 and p.splits_by_length == ((12288, 14), (32768, 16))
    assert [p.split_for(n) for n in (None, 1, 12287, 12288, 20000, 32768, 10**6)] == [12, 12, 12, 14, 14, 16, 16]


def test_the_base_split_may_come_from_the_maps_folder():
    p = c('policy "p" { split 14 from 8192 tokens }', maps=MAPS, model=MODEL)
    assert (p.split, p.split_for(8191), p.split_for(8192)) == (12, 12, 14)
    deferred = c('policy "p" { split 14 from 8192 tokens }', defer_split=True)
    assert deferred.split is None and deferred.split_for(100) is None and deferred.split_for(9000) == 14


def test_without_a_schedule_every_length_gets_the_one_split():
    p = c('policy "p" { split 12 }', maps=MAPS)
    assert p.splits_by_length == () and p.split_for(10**6) == 12


def test_the_schedule_is_part_of_the_identity():
    base = c('policy "p" { split 12 }', maps=MAPS).identity
    assert c('policy "p" { split 12 split 14 from 12288 tokens }', maps=MAPS).identity != base
    assert c('policy "p" { split 12 split 14 from 16384 tokens }', maps=MAPS).identity != \
        c('policy "p" { split 12 split 14 from 12288 tokens }', maps=MAPS).identity


def test_every_split_needs_its_maps():
    message = error('policy "p" {\n  split 12\n  split 15 from 12288 tokens\n}', maps=MAPS, model=MODEL)
    assert "split 15 has no maps in the maps folder, which has splits 12, 14, 16" in message
    assert "p.rfpolicy:3:" in message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("split 12 split 14 from 12288 tokens split 16 from 12288 tokens",
         "split from 12288 tokens is set twice (first at line 1)"),
        ("split 12 split 14 from 0 tokens", "a split's prompt length must be at least 1 token, got 0"),
        ("split 12 split 14 from 1.5 tokens", "a split's prompt length must be a whole number, got 1.5"),
        ("split 12 split 14 from 12288 tokens split 13", "split is set twice (first at line 1)"),
        ("split 12 split 25 from 12288 tokens", "split 25 is out of range: the model has 24 layers"),
        ("arm exact split 14 from 12288 tokens",
         "arm exact runs every layer exactly for every prompt: a split by prompt length has nothing to choose"),
    ],
)
def test_bad_schedules_are_refused_with_the_reason(body, message):
    assert message in error(f'policy "p" {{ {body} }}', maps=MAPS, model=MODEL)


def test_a_selection_must_read_layers_below_every_split_it_can_run_at():
    text = 'policy "p" {{ split 14 split {s} from 12288 tokens select attention_topk(layers=[3, 12]) }}'
    assert c(text.format(s=16), maps=MAPS, model=MODEL).split_for(20000) == 16
    assert "attention_topk(): layer 12 is not below split 12" in error(text.format(s=12), maps=MAPS, model=MODEL)
