from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.attention import SPEC, attention_topk
from sgl_ridgefill.selectors.base import AttentionRequirement, SelectionError
from sgl_ridgefill.selectors.spec import ArgumentError, BindContext

from .helpers import inputs, table_and_ids

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


def _needle_prompt():
    """A haystack sentence, a needle sentence whose peak is its key word, and another haystack sentence."""
    words = [" The", " sky", " is", " blue", ".",  # 0-4
             " One", " magic", " number", " is", ":", " 7", "3", "1", "4", ".",  # 5-14: the needle
             " Grass", " is", " green", "."]  # 15-18
    table, ids = table_and_ids(words)
    stats = torch.full((len(words),), 0.01)
    stats[6], stats[4] = 1.0, 0.3  # the key word; the haystack's sentence end
    return table, ids, stats


def test_sentence_gives_a_short_sentence_its_peak_so_the_needle_is_taken_whole():
    """Attention peaks on a needle's key word; its number's last digits sit further from it than the pool
    reaches. ``sentence=N`` gives every row of a sentence of at most N tokens the highest attention in it,
    so the sentence ranks whole behind its peak; the pooled window's spill into the sentence before does not
    bring that sentence along."""
    table, ids, stats = _needle_prompt()
    req = AttentionRequirement((3,), "last", 64)
    x = inputs(ids, len(ids), attention={req: stats}, tokens=table)
    pooled = attention_topk(x, q=64, share=10 / 19, layers=(3,), query="last", pool=2)
    assert sorted(pooled.tolist()[:5]) == [4, 5, 6, 7, 8]  # the pool's window: the digits are not in it
    whole = attention_topk(x, q=64, share=10 / 19, layers=(3,), query="last", pool=2, sentence=16)
    assert whole.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]  # ties rank in position order: the budget cuts
    assert attention_topk(x, q=64, share=11 / 19, layers=(3,), query="last", pool=2, sentence=16).tolist()[10] == 14
    # The haystack sentence before keeps its own peak (0.3, its end): only row 4 rode the pool's window.
    assert attention_topk(x, q=64, share=1.0, layers=(3,), query="last", pool=2, sentence=16).tolist()[11:16] == [
        0, 1, 2, 3, 15]


def test_a_sentence_longer_than_the_limit_keeps_the_pooled_scores():
    table, ids, stats = _needle_prompt()
    req = AttentionRequirement((3,), "last", 64)
    x = inputs(ids, len(ids), attention={req: stats}, tokens=table)
    # The needle is 10 tokens: a limit of 9 leaves it to the pool, as does sentence=0 (the default).
    short = attention_topk(x, q=64, share=5 / 19, layers=(3,), query="last", pool=2, sentence=9)
    assert short.tolist() == attention_topk(x, q=64, share=5 / 19, layers=(3,), query="last", pool=2).tolist()
    without_pool = attention_topk(x, q=64, share=10 / 19, layers=(3,), query="last", sentence=10)
    assert without_pool.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def test_sentence_reads_the_token_table_and_says_so():
    ctx = BindContext(arm="ridgefill", split=12, tail=64, num_layers=24, attention_layers=None)
    assert not SPEC.bind({}, ctx).needs_tokens and SPEC.bind({}, ctx).kwargs["sentence"] == 0
    assert SPEC.bind({"sentence": 48}, ctx).needs_tokens
    req = AttentionRequirement((3,), "last", 64)
    x = inputs(list(range(12)), 10, attention={req: torch.tensor(STATS)})
    with pytest.raises(SelectionError, match=r"attention_topk\(\) needs SelectionInputs.tokens"):
        attention_topk(x, q=64, share=0.3, layers=(3,), query="last", sentence=8)
