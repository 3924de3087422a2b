"""The statistics reference's unmasked blocks (keys every query sees) and masked blocks against a direct
softmax over every query and head."""

from __future__ import annotations

import torch

from sgl_ridgefill.kernels.attention_stats import attention_received_reference


def _direct(q, k, q_pos, k_pos, scale):
    group = q.shape[1] // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)  # [n_k, heads, d]
    s = torch.einsum("qhd,khd->hqk", q.float() * scale, kk)
    s = s.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return s.softmax(-1).sum(dim=(0, 1))


def test_visible_and_partly_hidden_blocks_match_the_direct_softmax():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(20, 4, 8, generator=g), torch.randn(70, 2, 8, generator=g)
    for q_pos in (torch.arange(50, 70), torch.tensor([*range(10, 20), *range(60, 70)])):
        got = attention_received_reference(q, k, q_pos, torch.arange(70), 0.3, block=16)
        assert torch.allclose(got, _direct(q, k, q_pos, torch.arange(70), 0.3), atol=1e-5)


def _recording_matmul(monkeypatch):
    sizes, matmul = [], torch.matmul

    def recording(*args, **kwargs):
        out = matmul(*args, **kwargs)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(torch, "matmul", recording)
    return sizes


def test_one_pass_over_query_blocks_matches_the_direct_softmax_within_the_memory_bound(monkeypatch):
    # block * n_q * heads >= n_k * heads: whole rows of a few queries fit, so each score is computed once.
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(12, 6, 8, generator=g) * 2, torch.randn(90, 3, 8, generator=g)
    k_pos = torch.arange(90)
    sizes = _recording_matmul(monkeypatch)
    for q_pos in (torch.arange(78, 90), torch.tensor([*range(3, 9), *range(84, 90)]), torch.arange(0, 12)):
        sizes.clear()
        got = attention_received_reference(q, k, q_pos, k_pos, 0.3, block=16)
        assert torch.allclose(got, _direct(q, k, q_pos, k_pos, 0.3), atol=1e-5)
        assert max(sizes) <= 12 * 6 * 16
        # one score matmul per block of 12 * 16 // 90 = 2 queries: [3 kv heads, 2 queries x 2 heads, 90 keys]
        assert sizes.count(3 * 2 * 2 * 90) == 6


def test_one_pass_gives_nothing_for_a_query_that_sees_no_key():
    q, k = torch.randn(3, 2, 4), torch.randn(5, 1, 4)
    k_pos = torch.tensor([4, 5, 6, 7, 8])
    q_pos = torch.tensor([2, 6, 8])  # the first query sees no key
    got = attention_received_reference(q, k, q_pos, k_pos, 1.0, block=64)
    assert torch.isfinite(got).all()
    assert torch.allclose(got.sum(), torch.tensor(4.0))  # two queries x two heads, each softmax sums to 1
    assert torch.allclose(got, _direct(q[1:], k, q_pos[1:], k_pos, 1.0), atol=1e-6)


def test_both_passes_agree_at_the_selection_shape():
    # The server's shape in small: the tail's queries against the whole prompt, GQA 7:1.
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(64, 14, 16, generator=g), torch.randn(700, 2, 16, generator=g)
    q_pos, k_pos = torch.arange(636, 700), torch.arange(700)
    one = attention_received_reference(q, k, q_pos, k_pos, 0.25, block=256)  # 64*256 >= 700: one pass
    two = attention_received_reference(q, k, q_pos, k_pos, 0.25, block=8)  # 64*8 < 700: two passes
    assert torch.allclose(one, two, rtol=1e-5, atol=1e-6)


def test_no_query_gives_zero_for_every_key():
    k = torch.randn(9, 2, 4)
    got = attention_received_reference(torch.randn(0, 4, 4), k, torch.arange(0), torch.arange(9), 1.0)
    assert torch.equal(got, torch.zeros(9))


def test_on_the_host_one_pass_takes_queries_in_cache_sized_blocks(monkeypatch):
    # Blocks of a few hundred queries' scores overflow the CPU's caches between the GEMM and the softmax: on the
    # host the block holds at most _HOST_BLOCK_SCORES scores, whatever `block` allows.
    from sgl_ridgefill.kernels import attention_stats

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(40, 6, 8, generator=g), torch.randn(90, 3, 8, generator=g)
    q_pos, k_pos = torch.arange(50, 90), torch.arange(90)
    monkeypatch.setattr(attention_stats, "_HOST_BLOCK_SCORES", 6 * 90 * 4)  # four queries' scores
    sizes = _recording_matmul(monkeypatch)
    got = attention_received_reference(q, k, q_pos, k_pos, 0.3, block=4096)  # the memory bound allows all 40
    assert torch.allclose(got, _direct(q, k, q_pos, k_pos, 0.3), atol=1e-5)
    assert max(sizes) == 3 * 4 * 2 * 90  # [3 kv heads, 4 queries x 2 heads, 90 keys]
    assert sizes.count(3 * 4 * 2 * 90) == 10


def test_a_query_that_sees_no_key_adds_nothing_beside_queries_that_see_keys():
    # One block holds both: the blind query's row is not masked (no NaN) and weighs nothing.
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(6, 4, 8, generator=g), torch.randn(12, 2, 8, generator=g)
    k_pos = torch.arange(5, 17)
    q_pos = torch.tensor([1, 3, 9, 12, 15, 16])  # the first two see no key
    got = attention_received_reference(q, k, q_pos, k_pos, 0.5, block=64)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, _direct(q[2:], k, q_pos[2:], k_pos, 0.5), atol=1e-5)
    assert torch.allclose(got.sum(), torch.tensor(16.0))  # four queries x four heads
