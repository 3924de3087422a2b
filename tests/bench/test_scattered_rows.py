"""The scattered-rows benchmark: its rows are a pooled selection's windows, and both of its arms (the masked
blocks and the CPU backend's path) compute the same attention as one direct masked softmax."""

from __future__ import annotations

import json

import pytest
import torch

from sgl_ridgefill.attention.cpu import QUERY_BLOCK
from sgl_ridgefill.bench import scattered_rows


def test_rows_are_whole_windows_of_the_prefix_share():
    pos = scattered_rows.scattered_positions(1000, 0.1, 17, torch.Generator().manual_seed(0))
    assert pos.numel() == 6 * 17  # round(100 / 17) windows
    assert torch.equal(pos, pos.unique())  # ascending, no row twice
    assert int(pos.max()) < 1000
    starts = pos.view(-1, 17)[:, 0]
    assert torch.equal(pos.view(-1, 17), starts[:, None] + torch.arange(17))


def test_both_block_sizes_match_one_masked_softmax():
    g = torch.Generator().manual_seed(1)
    pos = scattered_rows.scattered_positions(300, 0.8, 3, g)  # 80 windows of 3
    q = torch.randn(1, 14, pos.numel(), 64, generator=g)
    k, v = torch.randn(1, 2, 340, 64, generator=g), torch.randn(1, 2, 340, 64, generator=g)
    kk, vv = k.repeat_interleave(7, dim=1), v.repeat_interleave(7, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q, kk) * 0.125
    s = s.masked_fill(torch.arange(340)[None, :] > pos[:, None], float("-inf"))
    want = torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), vv)
    for block in (7, QUERY_BLOCK, 512):
        assert torch.allclose(scattered_rows.masked(q, k, v, pos, block, 0.125), want, atol=1e-5)
    assert pos.numel() > QUERY_BLOCK  # the backend's path over more than one block
    assert torch.allclose(scattered_rows.backend(q, k, v, pos, 0.125), want, atol=1e-5)


def test_main_prints_both_times_and_their_ratio(capsys):
    assert scattered_rows.main(["--lengths", "400", "--tail", "64", "--repeats", "1", "--dtypes", "float32"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(lines[0]) == {"cpu_capability", "threads"}
    row = lines[1]
    assert row["length"] == 400 and row["rows"] == 34  # round(0.1 * 336 / 17) = 2 windows
    assert row["ratio"] == pytest.approx(row["masked_s"] / row["backend_s"], rel=0.01)
    assert row["max_abs_diff"] < 1e-4
