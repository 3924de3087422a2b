"""CompiledPolicy.select on hand-made inputs; every expected row set is worked out in the comments."""

from __future__ import annotations

import torch

from sgl_ridgefill.policy import ModelInfo, compile_policy
from sgl_ridgefill.policy.plan import SelectionPlan, SelectorNode, SizeLimit
from sgl_ridgefill.selectors.base import AttentionRequirement, ProbeRequirement, SelectionInputs
from sgl_ridgefill.selectors.random_control import random_rows
from sgl_ridgefill.selectors.spec import BindContext, SelectorSpec
from sgl_ridgefill.selectors.tokens import TokenTable

from .helpers import parse

# Prefix of 10 rows (then a 2-row tail): row 0 is special, rows 3 and 8 are digits.
TABLE = TokenTable.from_pieces(["<s>", " a", " 7", "?"], special_ids=[0])
IDS = [0, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 3]
PROBE = [0.0, 0.7, 0.2, 0.1, 0.9, 0.3, 0.8, 0.05, 0.6, 0.4]  # ranks 4, 6, 1, 8, 9, 5, 2, 3, 7, 0
ATTENTION = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # ranks 9, 8, 7, ...
MODEL = ModelInfo.dense(4)


def run(body: str, seed: int = 0) -> list[int]:
    policy = compile_policy(parse(f'policy "p" {{ split 2 tail 2 {body} }}'), model=MODEL)
    inputs = SelectionInputs(
        token_ids=torch.tensor(IDS),
        prefix_len=10,
        seed=seed,
        tokens=TABLE,
        attention={AttentionRequirement((1,), "last", 2): torch.tensor(ATTENTION)},
        probe={ProbeRequirement(4): torch.tensor(PROBE)},
    )
    rows = policy.select(inputs)
    assert rows.dtype == torch.int64
    return rows.tolist()


ATT = "attention_topk(q=2, layers=[1], share={})"


def test_budget_sized_by_a_set_with_a_reservation_and_rows_outside():
    # size(digits [3, 8] | top 20 % attention [9, 8]) = |{3, 8, 9}| = 3 rows. The reservation takes
    # 1 digit (3), the probe fills the other 2 (4, 6), and the special token 0 is added outside.
    body = f"select probe(rows=4) budget size(digits() | {ATT.format('20%')}) reserve digits() up to 1 plus special_tokens()"
    assert run(body) == [0, 3, 4, 6]


def test_a_reservation_larger_than_the_budget_stops_at_the_budget():
    assert run("select probe(rows=4) budget 2 reserve digits() up to 5") == [3, 8]
    # 10 % of the 10-row prefix is 1 row.
    assert run("select probe(rows=4) budget 3 reserve digits() up to 10%") == [3, 4, 6]


def test_budget_shares_counts_and_factors():
    assert run("select probe(rows=4) budget 30%") == [1, 4, 6]
    assert run("select probe(rows=4) budget 0 plus digits()") == [3, 8]
    assert run("select probe(rows=4) budget 1.5 * size(digits())") == [1, 4, 6]  # 1.5 * 2 = 3 rows
    assert run("select digits() budget 5") == [3, 8]  # fewer rows than the budget


def test_set_operations_and_top():
    assert run(f"select top({ATT.format('100%')}, 3) | digits()") == [3, 7, 8, 9]
    assert run(f"select {ATT.format('50%')} & top(probe(rows=4), 50%)") == [6, 8, 9]
    assert run(f"select {ATT.format('50%')} - digits()") == [5, 6, 7, 9]
    # top keeps the left operand's ranking: probe order 4, 6, 1, 8, ... restricted to the top-half
    # attention rows {5, 6, 7, 8, 9} is 6, 8, 9, 5, 7.
    assert run(f"select top(probe(rows=4) & {ATT.format('50%')}, 2)") == [6, 8]


def test_random_control_matches_random_rows():
    assert run("select random(count=4)", seed=11) == random_rows(4, 10, 11).tolist()


def test_no_selection_and_empty_prefix():
    policy = compile_policy(parse('policy "p" { split 2 }'))
    assert policy.select(SelectionInputs(torch.tensor(IDS), 10)).tolist() == []
    policy = compile_policy(parse('policy "p" { split 2 select digits() }'))
    assert policy.select(SelectionInputs(torch.tensor(IDS), 0, tokens=TABLE)).tolist() == []


def test_a_selector_used_twice_runs_once_per_request():
    calls = []

    def counting(inputs):
        """Rows 1 and 2."""
        calls.append(1)
        return torch.tensor([2, 1])

    bound = SelectorSpec("counting", counting).bind({}, BindContext("ridgefill", 2, 2))
    node = SelectorNode(bound)
    plan = SelectionPlan(node, budget=SizeLimit(0.5, node))
    assert plan.select(SelectionInputs(torch.tensor(IDS), 10)).tolist() == [2]
    assert len(calls) == 1


def test_expected_rows_estimate():
    policy = compile_policy(parse(f'policy "p" {{ split 2 select {ATT.format("10%")} | random(count=50) }}'), model=MODEL)
    # Independent selections: 100 + 50 - 100 * 50 / 1000 = 145 rows of a 1000-row prefix.
    assert policy.selection.expected_rows(1000) == 145.0
