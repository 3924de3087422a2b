from __future__ import annotations

import math

import pytest
import torch

from sgl_ridgefill.selectors.rows import (
    difference_rows,
    intersect_rows,
    rank_ascending,
    rank_by_score,
    share_count,
    sorted_rows,
    top_rows,
    union_rows,
)


def t(*xs):
    return torch.tensor(xs, dtype=torch.int64)


@pytest.mark.parametrize(
    "share, n, expected",
    [(0.10, 10, 1), (0.25, 10, 3), (0.29, 100, 29), (0.15, 10, 2), (0.5, 0, 0), (1.0, 7, 7), (0.0, 7, 0), (0.24, 10, 2)],
)
def test_share_count_rounds_to_nearest_half_up(share, n, expected):
    assert share_count(share, n) == expected


def test_rank_by_score_ties_keep_position_order_and_nan_ranks_last():
    scores = torch.tensor([0.1, 0.5, 0.5, math.nan, 0.2])
    assert rank_by_score(scores).tolist() == [1, 2, 4, 0, 3]


def test_rank_ascending_ties_keep_position_order():
    assert rank_ascending(torch.tensor([3.0, 1.0, 3.0, 0.0])).tolist() == [3, 1, 0, 2]


def test_set_operations_keep_left_order():
    a, b = t(3, 1, 2), t(1, 2, 3, 0)
    assert union_rows(t(3, 1), b).tolist() == [3, 1, 2, 0]
    assert intersect_rows(a, t(2, 3)).tolist() == [3, 2]
    assert difference_rows(a, t(1)).tolist() == [3, 2]
    assert union_rows(t(), a).tolist() == [3, 1, 2]
    assert intersect_rows(t(), a).tolist() == []
    assert difference_rows(a, t()).tolist() == [3, 1, 2]


def test_top_and_sorted():
    assert top_rows(t(5, 2, 9), 2).tolist() == [5, 2]
    assert top_rows(t(5, 2, 9), 10).tolist() == [5, 2, 9]
    assert top_rows(t(5, 2, 9), 0).tolist() == []
    assert sorted_rows(t(5, 2, 9)).tolist() == [2, 5, 9]
