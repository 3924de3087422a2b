from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.attention import SPEC, attention_topk
from sgl_ridgefill.selectors.base import AttentionRequirement, SelectionError
from sgl_ridgefill.selectors.spec import ArgumentError, BindContext

from .helpers import inputs

STATS = [0.5, 0.1, 0.9, 0.3, 0.9, 0.0, 0.2, 0.8, 0.4, 0.6]


def test_top_share_by_attention_received():
    req = AttentionRequirement((3, 7), "last", 64)
    x = inputs(list(range(12)), 10, attention={req: torch.tensor(STATS)})
    # 30 % of 10 rows = 3: the two 0.9s (earlier first), then 0.8.
    assert attention_topk(x, q=64, share=0.30, layers=(3, 7), query="last").tolist() == [2, 4, 7]
    # 25 % of 10 = 2.5 -> 3 rows as well (halves round up); 5 % -> 1 row (0.5 rounds up).
    assert attention_topk(x, q=64, share=0.25, layers=(3, 7), query="last").tolist() == [2, 4, 7]
    assert attention_topk(x, q=64, share=0.05, layers=(3, 7), query="last").tolist() == [2]


def test_the_question_blind_variant_reads_its_own_statistic():
    blind = AttentionRequirement((3,), "before_tail", 4)
    x = inputs(list(range(12)), 10, attention={blind: torch.tensor(STATS[::-1])})
    assert attention_topk(x, q=4, share=0.2, layers=(3,), query="before_tail").tolist() == [5, 7]
    with pytest.raises(SelectionError, match="which SelectionInputs does not hold"):
        attention_topk(x, q=4, share=0.2, layers=(3,), query="last")


def test_wrong_statistic_shape_is_refused():
    req = AttentionRequirement((3,), "last", 64)
    x = inputs(list(range(12)), 10, attention={req: torch.zeros(12)})
    with pytest.raises(SelectionError, match=r"has shape \(12,\), expected \[10\]"):
        attention_topk(x, q=64, share=0.1, layers=(3,), query="last")


def _bind(split, layers=None, attention_layers=None, num_layers=None):
    args = {"layers": layers} if layers is not None else {}
    ctx = BindContext(arm="ridgefill", split=split, tail=64, num_layers=num_layers, attention_layers=attention_layers)
    return SPEC.bind(args, ctx)


def test_default_layers_are_those_of_3_7_11_15_below_the_split():
    assert _bind(12).requirements == (AttentionRequirement((3, 7, 11), "last", 64),)
    assert _bind(16).requirements == (AttentionRequirement((3, 7, 11, 15), "last", 64),)
    assert _bind(4).requirements == (AttentionRequirement((3,), "last", 64),)
    # A hybrid model without attention at 7: only the attention layers count.
    assert _bind(12, attention_layers=(3, 11, 15)).requirements == (AttentionRequirement((3, 11), "last", 64),)


def test_layer_errors():
    with pytest.raises(ArgumentError, match="none of the default layers 3, 7, 11, 15 is an attention layer below split 3"):
        _bind(3)
    with pytest.raises(ArgumentError, match="layer 12 is not below split 12"):
        _bind(12, layers=(3, 12))
    with pytest.raises(ArgumentError, match="layer 40 does not exist"):
        _bind(12, layers=(40,), num_layers=32)
    with pytest.raises(ArgumentError, match="layer 5 is not an attention layer"):
        _bind(12, layers=(5,), attention_layers=(3, 7, 11))
    assert _bind(12, layers=(7, 2)).requirements == (AttentionRequirement((2, 7), "last", 64),)


def test_requirement_validation():
    with pytest.raises(ValueError, match="ascending and unique"):
        AttentionRequirement((7, 3), "last", 64)
    with pytest.raises(ValueError, match="query must be one of"):
        AttentionRequirement((3,), "first", 64)
    with pytest.raises(ValueError, match="q must be a positive integer"):
        AttentionRequirement((3,), "last", 0)
    assert len({AttentionRequirement((3,), "last", 64), AttentionRequirement((3,), "last", 64)}) == 1


def test_pool_takes_the_neighbours_of_every_peak():
    # One peak at row 10 of 20 and a weaker one at 3: without pooling the top 5 rows are scattered;
    # with pool=2 every row within 2 of the peak scores the peak's attention, so the whole window comes first.
    stats = torch.full((20,), 0.01)
    stats[10], stats[3], stats[15] = 1.0, 0.5, 0.02
    req = AttentionRequirement((3,), "last", 64)
    x = inputs(list(range(24)), 20, attention={req: stats})
    plain = attention_topk(x, q=64, share=0.25, layers=(3,), query="last", pool=0)
    assert plain.tolist() == [10, 3, 15, 0, 1]
    pooled = attention_topk(x, q=64, share=0.25, layers=(3,), query="last", pool=2)
    assert pooled.tolist() == [8, 9, 10, 11, 12]
    # The next five: the weaker peak's window (rows 1-5), cut by the budget at 10 rows.
    assert attention_topk(x, q=64, share=0.5, layers=(3,), query="last", pool=2).tolist()[5:] == [1, 2, 3, 4, 5]
    # Windows stop at the prefix's ends: a peak at row 0 brings rows 0..pool only.
    edge = torch.zeros(20)
    edge[0] = 1.0
    x = inputs(list(range(24)), 20, attention={req: edge})
    assert attention_topk(x, q=64, share=0.15, layers=(3,), query="last", pool=4).tolist()[:3] == [0, 1, 2]


def test_pool_defaults_to_zero_and_a_negative_pool_is_a_policy_error():
    ctx = BindContext(arm="ridgefill", split=12, tail=64, num_layers=24, attention_layers=None)
    assert SPEC.bind({}, ctx).kwargs["pool"] == 0
    assert SPEC.bind({"pool": 8}, ctx).kwargs["pool"] == 8
    from sgl_ridgefill.eval.arms import check_rows_select

    check_rows_select("attention_topk(pool=8)", 12)
    with pytest.raises(ValueError, match="argument pool of attention_topk.* must be between 0 and"):
        check_rows_select("attention_topk(pool=-1)", 12)
