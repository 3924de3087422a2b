"""Attention received per key: the blocked two-pass reference against a full softmax, and hand-made cases."""

from __future__ import annotations

import math

import pytest
import torch

from sgl_ridgefill.kernels.attention_stats import attention_received, attention_received_reference


def _naive(q, k, q_pos, k_pos, scale) -> torch.Tensor:
    """Full ``[n_q, heads, n_k]`` softmax in float64, GQA by repeating each kv head ``group`` times."""
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1)  # [n_k, n_q_heads, d]: head h -> kv head h // group
    s = torch.einsum("qhd,khd->qhk", q.double(), keys) * scale
    visible = k_pos[None, :] <= q_pos[:, None]
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a query that sees nothing gives nothing
    return p.sum(dim=(0, 1))


def _inputs(n_q, n_k, n_heads, n_kv, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(n_q, n_heads, head_dim, generator=gen) * 2).to(dtype)
    k = torch.randn(n_k, n_kv, head_dim, generator=gen).to(dtype)
    k_pos = torch.arange(n_k)
    q_pos = torch.arange(n_k - n_q, n_k)
    return q, k, q_pos, k_pos


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [1, 2, 7])
@pytest.mark.parametrize("n_q", [1, 7])
@pytest.mark.parametrize("block", [128, 1024])
def test_reference_matches_full_softmax(n_q: int, group: int, dtype: torch.dtype, block: int) -> None:
    n_kv, head_dim, n_k = 2, 80, 989
    q, k, q_pos, k_pos = _inputs(n_q, n_k, n_kv * group, n_kv, head_dim, dtype)
    q_pos = q_pos - 300  # queries sit inside the keys, so the causal mask cuts every block it crosses
    got = attention_received_reference(q, k, q_pos, k_pos, head_dim**-0.5, block=block)
    want = _naive(q, k, q_pos, k_pos, head_dim**-0.5)
    assert got.dtype == torch.float32 and got.shape == (n_k,)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert bool((got[q_pos.max() + 1 :] == 0).all())


def test_causal_mask_on_a_hand_made_case() -> None:
    # Zero queries give equal scores, so each query spreads 1 evenly over the keys it sees.
    k = torch.randn(4, 1, 8)
    q = torch.zeros(3, 1, 8)
    q_pos = torch.tensor([1, 3, -1])  # the third query precedes every key and sees none
    got = attention_received_reference(q, k, q_pos, torch.arange(4), 1.0, block=3)
    torch.testing.assert_close(got, torch.tensor([0.75, 0.75, 0.25, 0.25]))


def test_positions_need_not_be_sorted() -> None:
    k = torch.randn(4, 1, 8)
    q = torch.zeros(1, 1, 8)
    got = attention_received_reference(q, k, torch.tensor([5]), torch.tensor([9, 2, 5, 7]), 1.0, block=2)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.5, 0.5, 0.0]))


def test_gqa_maps_query_head_to_kv_head_by_integer_division() -> None:
    # 4 query heads over 2 kv heads: heads 0 and 1 read kv head 0, heads 2 and 3 read kv head 1.
    # kv head 0 favours key 0, kv head 1 favours key 1; only query heads 0 and 1 are non-zero.
    k = torch.tensor([[[10.0], [0.0]], [[0.0], [10.0]]])  # [n_k=2, n_kv=2, d=1]
    q = torch.tensor([[[1.0], [1.0], [0.0], [0.0]]])  # [n_q=1, heads=4, d=1]
    got = attention_received_reference(q, k, torch.tensor([1]), torch.arange(2), 1.0)
    sharp = math.exp(10) / (math.exp(10) + 1)
    # By h // group: two sharp heads on key 0, two even heads. (By h % n_kv it would be [2, 2].)
    want = torch.tensor([2 * sharp + 1.0, 2 * (1 - sharp) + 1.0])
    torch.testing.assert_close(got, want)


def test_total_equals_query_head_pairs_that_see_a_key() -> None:
    q, k, _, k_pos = _inputs(7, 111, 14, 2, 96, torch.float32)
    q_pos = torch.tensor([-5, 0, 3, 50, 110, 200, -1])  # two queries see no key
    got = attention_received_reference(q, k, q_pos, k_pos, 0.1, block=16)
    assert got.sum().item() == pytest.approx(5 * 14, rel=1e-5)


def test_never_builds_the_full_score_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    n_q, heads, n_k, block = 7, 14, 989, 100
    q, k, q_pos, k_pos = _inputs(n_q, n_k, heads, 2, 96, torch.float32)
    largest = []
    matmul = torch.matmul

    def recording_matmul(*args, **kwargs):
        result = matmul(*args, **kwargs)
        largest.append(result.numel())
        return result

    monkeypatch.setattr(torch, "matmul", recording_matmul)
    attention_received_reference(q, k, q_pos, k_pos, 0.1, block=block)
    assert largest and max(largest) <= n_q * heads * block


def test_strided_inputs_give_the_same_result() -> None:
    q, k, q_pos, k_pos = _inputs(7, 200, 8, 2, 64, torch.float32)
    qkv = torch.cat([q.reshape(7, -1), torch.randn(7, 100)], dim=1)  # q as a column window of a wider buffer
    q_view = qkv[:, : 8 * 64].view(7, 8, 64)
    k_view = torch.randn(400, 2, 64)[::2]
    k_view.copy_(k)
    assert not q_view.is_contiguous() and not k_view.is_contiguous()
    want = attention_received_reference(q, k, q_pos, k_pos, 0.125)
    torch.testing.assert_close(attention_received(q_view, k_view, q_pos, k_pos, 0.125), want)


def test_argument_errors_name_the_values() -> None:
    q, k, q_pos, k_pos = _inputs(7, 50, 6, 4, 32, torch.float32)
    with pytest.raises(ValueError) as info:
        attention_received(q, k, q_pos, k_pos, 0.1)
    assert str(info.value) == (
        "attention_received: n_q_heads=6 must be a multiple of n_kv_heads=4 (grouped-query attention)"
    )
    k = k[:, :2]
    with pytest.raises(ValueError) as info:
        attention_received(q, k, q_pos[:5], k_pos, 0.1)
    assert str(info.value) == "attention_received: q_positions must have shape (7,), got (5,)"
    with pytest.raises(ValueError) as info:
        attention_received(q, k, q_pos.float(), k_pos, 0.1)
    assert str(info.value) == "attention_received: q_positions must hold integer positions, got torch.float32"
    with pytest.raises(ValueError) as info:
        attention_received(q, k[..., :16], q_pos, k_pos, 0.1)
    assert str(info.value) == "attention_received: q has head_dim 32 but k has 16"
    with pytest.raises(ValueError) as info:
        attention_received_reference(q, k, q_pos, k_pos, 0.1, block=0)
    assert str(info.value) == "attention_received_reference: block must be a positive integer, got 0"
    with pytest.raises(ValueError) as info:
        attention_received(q, k, q_pos, k_pos, float("nan"))
    assert str(info.value) == "attention_received: scale must be a positive finite number, got nan"
