"""The Gated DeltaNet projection layouts (``gdn_layout.py``) against transformers' own reordering (no engine)."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.gdn_layout import gdn_rows, hf_projections, hf_qkv_weight

qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _mixer():
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=4,
                          linear_value_head_dim=3, linear_conv_kernel_dim=4)
    torch.manual_seed(0)
    return qn.Qwen3NextGatedDeltaNet(cfg, 0)


def test_interleaved_rows_match_transformers_reordering():
    mixer = _mixer()
    h = torch.randn(5, 32)
    q, k, v, z, b, a = mixer.fix_query_key_value_ordering(mixer.in_proj_qkvz(h)[None], mixer.in_proj_ba(h)[None])
    mixed, z2, b2, a2 = hf_projections(mixer, h)
    torch.testing.assert_close(mixed, torch.cat([q[0].reshape(5, -1), k[0].reshape(5, -1), v[0].reshape(5, -1)], -1))
    torch.testing.assert_close(z2, z[0].reshape(5, -1))
    torch.testing.assert_close(b2, b[0])
    torch.testing.assert_close(a2, a[0])
    torch.testing.assert_close(h @ hf_qkv_weight(mixer).T, mixed)


def test_contiguous_rows_are_ranges():
    # 2 key heads of 16, 4 value heads of 8: q, k 32 rows each, v and z 32 each.
    qkv, z, ba = gdn_rows(2, 4, 16, 8, interleaved=False)
    assert qkv.tolist() == list(range(96)) and z.tolist() == list(range(96, 128)) and ba.tolist() == list(range(8))
    qkv, z, ba = gdn_rows(2, 4, 16, 8, interleaved=True)  # a permutation of every row
    assert sorted(torch.cat([qkv, z]).tolist()) == list(range(128)) and sorted(ba.tolist()) == list(range(8))
