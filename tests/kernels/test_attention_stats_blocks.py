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
