"""The padded-FLOP model and the GPU estimate's records: what tiles execute against what attention needs, and
the planner benchmark's host path on meta tensors."""

from __future__ import annotations

import json

import pytest
import torch

from sgl_ridgefill.attention.planner import plan_groups, plan_virtual_requests
from sgl_ridgefill.gpu_check import estimates, tiles


def test_a_tile_aligned_run_executes_what_it_needs_but_the_diagonal():
    # One run of 256 rows over 256 keys, tiles of 128 x 64 per head: 2 row tiles, each reading up to its last
    # row's keys (128 and 256): 128 * (128 + 256) pairs, against 256 * 257 / 2 useful ones.
    vr = plan_virtual_requests(torch.arange(256))
    assert tiles.useful_pairs(vr) == 256 * 257 // 2
    assert tiles.executed_pairs(vr, tiles.TILINGS["triton"], group=1) == 128 * (128 + 256)


def test_packed_gqa_rows_count_per_query_head():
    # fa3 packs 4 query heads of a KV head into a 128-row tile: 32 query rows a tile.
    vr = plan_virtual_requests(torch.arange(100, 132))  # 32 rows after a 100-row prefix
    assert tiles.executed_pairs(vr, tiles.TILINGS["fa3"], group=4) == 32 * 256  # one tile: keys up to 132 -> 256


def test_a_group_reads_its_keys_up_to_its_last_row_once():
    positions = torch.tensor([10, 500, 1000])
    vr = plan_groups(positions, group_size=128)
    assert tiles.useful_pairs(vr) == 11 + 501 + 1001
    # One 128-row tile, every key tile up to row 1000's 1001 keys: 16 tiles of 64.
    assert tiles.executed_pairs(vr, tiles.TILINGS["fa3"], group=4) == 128 * 1024


def test_executed_is_never_below_useful():
    g = torch.Generator().manual_seed(0)
    positions = torch.sort(torch.randperm(4000, generator=g)[:700]).values
    for vr in (plan_virtual_requests(positions), plan_groups(positions, group_size=128)):
        for name, tiling in tiles.TILINGS.items():
            assert tiles.executed_pairs(vr, tiling, group=4) >= tiles.useful_pairs(vr), name


@pytest.fixture(scope="module")
def record():
    torch.set_num_threads(1)
    return estimates.estimate(estimates.Case("llama-3.1-8b", 16384, 4096, "10% pooled attention", "fa3"))


def test_an_estimate_record_holds_what_the_issue_asks_for(record):
    for key in ("host_ms", "syncs", "metadata_inits", "h2d_bytes", "mask_bytes", "executed_over_useful",
                "projected_ttft_s", "flop_bound_s"):
        assert key in record, key
    json.dumps(record)
    assert record["exact_rows"] == round(0.1 * 12288)
    assert record["mask_bytes"] == 0 and record["device_mask_bytes"] > 0
    assert record["metadata_inits"] == record["steps"] == 1  # 1,229 exact rows and the 4,096-row tail: one 8K step
    assert 1.0 <= record["executed_over_useful"] < 1.3
    assert record["flop_bound_s"] <= record["projected_ttft_s"]
    assert record["projected_speedup"] <= record["flop_bound_speedup"]


def test_the_markdown_states_the_method_and_the_targets(record):
    text = estimates.markdown([record], "python -m sgl_ridgefill.gpu_check.estimates", estimates.machine())
    assert "Every figure here is an **estimate**" in text
    assert "Against them (worst case of the table):" in text
    assert "| llama-3.1-8b | 16384 | 4096 | 10% pooled attention | fa3 |" in text


def test_streamed_maps_estimate_counts_every_chunks_copies(monkeypatch):
    from sgl_ridgefill.gpu_check import map_stream

    r = map_stream.stream_record("llama-3.1-8b", "residual", 16384)
    assert r["chunks_filled"] == 2 and r["upper_layers"] == 20  # prefix 12,288 rows: chunks of 8,192 and 4,096
    assert r["map_mib"] == 32.01 and r["resident_mib"] == 640.2  # A [4096, 4096] and b in bfloat16
    assert r["copy_ms"] == round(32 * 2**20 * (1 + 1 / 4096) / 50e9 * 1e3, 3)
    assert not r["hidden"] and r["exposed_ms"] > 0  # a 32 MiB copy outlasts one layer's fill of 8,192 rows
    # more slots copy the next chunk's first layers behind its lower layers; enough of them hide the copies
    assert 2 < r["slots_to_hide"] < r["upper_layers"] and r["slots_mib"] < r["resident_mib"]
    monkeypatch.setattr(map_stream, "H2D_GBPS", 1e4)  # a copy far faster than the fill hides entirely
    fast = map_stream.stream_record("llama-3.1-8b", "residual", 16384)
    assert fast["hidden"] and fast["exposed_ms"] == 0.0
    assert len(map_stream.records()) == len(map_stream.h200.SHAPES) * 4 * len(map_stream.h200.LENGTHS)
    assert "## Maps streamed from host memory" in "\n".join(map_stream.markdown([r]))


def test_the_ring_simulation_by_hand():
    """Copies of 1 ms, fills of 1 ms, 4 layers, 2 slots: with no lower layers to run behind, the first copy is
    exposed (1 ms); behind 10 ms of lower layers nothing is. A copy twice a fill needs more slots."""
    from sgl_ridgefill.gpu_check.map_stream import exposed_ms, slots_to_hide

    assert exposed_ms(1.0, [1.0], [0.0], 4, slots=2) == 1.0
    assert exposed_ms(1.0, [1.0], [10.0], 4, slots=2) == 0.0
    slow = [exposed_ms(2.0, [1.0], [10.0], 8, slots=k) for k in (2, 3, 4, 5, 8)]
    assert slow == sorted(slow, reverse=True) and slow[0] > 0 and slow[-1] == 0.0
    assert slots_to_hide(2.0, [1.0], [10.0], 8) == next(k for k in range(2, 9) if exposed_ms(2.0, [1.0], [10.0], 8, slots=k) <= 0.005)
