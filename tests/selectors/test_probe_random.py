from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.base import ProbeRequirement
from sgl_ridgefill.selectors.probe import SPEC as PROBE, probe
from sgl_ridgefill.selectors.random_control import SPEC as RANDOM, random, random_rows
from sgl_ridgefill.selectors.spec import ArgumentError, BindContext

from .helpers import inputs


def test_probe_ranks_every_prefix_row():
    req = ProbeRequirement(4)
    x = inputs(list(range(6)), 4, probe={req: torch.tensor([0.1, 0.9, 0.3, 0.9])})
    assert probe(x, rows=4).tolist() == [1, 3, 2, 0]


def test_probe_needs_a_filled_cache():
    for arm in ("nofill", "exact"):
        with pytest.raises(ArgumentError, match=f"arm {arm} fills nothing"):
            PROBE.bind({}, BindContext(arm=arm, split=12, tail=64))
    assert PROBE.bind({}, BindContext(arm="identity", split=12, tail=64)).requirements == (ProbeRequirement(256),)


def test_random_rows_are_seeded_distinct_and_sorted():
    a = random_rows(5, 100, seed=7)
    assert a.tolist() == sorted(set(a.tolist())) and len(a) == 5
    assert all(0 <= r < 100 for r in a.tolist())
    assert torch.equal(a, random_rows(5, 100, seed=7))
    assert not torch.equal(a, random_rows(5, 100, seed=8))
    assert random_rows(500, 10, seed=1).tolist() == list(range(10))
    assert random_rows(0, 10, seed=1).tolist() == []
    with pytest.raises(ValueError, match="count must be a non-negative integer, got -1"):
        random_rows(-1, 10, seed=1)


def test_random_selector_draws_the_same_rows_as_random_rows():
    x = inputs(list(range(120)), 100, seed=3)
    assert sorted(random(x, count=12, share=None).tolist()) == random_rows(12, 100, 3).tolist()
    assert len(random(x, count=None, share=0.25)) == 25
    with pytest.raises(ArgumentError, match="exactly one of count"):
        RANDOM.bind({}, BindContext(arm="ridgefill", split=2, tail=4))
    with pytest.raises(ArgumentError, match="exactly one of count"):
        RANDOM.bind({"count": 3, "share": 0.1}, BindContext(arm="ridgefill", split=2, tail=4))
