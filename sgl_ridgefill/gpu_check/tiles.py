"""Executed against useful attention FLOPs of a plan, by each kernel's tiling (estimates, engine-free).

*Useful* work is what exact attention needs: ``4 * head_dim`` FLOPs (``Q K^T`` and ``P V``) per query head
and (query row, admitted key) pair. A kernel *executes* whole tiles; what a tile computes beyond the useful
pairs (rows past a request's end, keys past a row's position) is padding. Per kernel, from its source:

- SGLang's Triton ``extend_attention_fwd`` on Hopper (head_dim <= 128): ``BLOCK_M = 128`` query rows of one
  head per program, ``BLOCK_N = 64`` keys a tile. A run: stage 1 reads the whole prefix for every query
  tile, stage 2 the run's own keys up to the tile's last row (causal). A masked group: every key tile with
  at least one admitted pair (``SKIP_TILE`` skips the rest), so a tile reads up to its last row's keys.
- fa3 (``flash_attn_with_kvcache``), head_dim 128, causal: 128-row by 128-key tiles; PackGQA packs the query
  heads of one KV head into the rows, so a tile holds ``128 / group`` query rows of every head of a group.
- FlashInfer's fa2 prefill: 128 packed rows (query rows times heads of a group) by 64 keys.

A run's keys are its visible keys; causality is bottom-right aligned (row ``i`` of ``m`` over ``k`` keys sees
``k - m + i + 1``), which is exactly its admitted count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ridgefill.attention.planner import VirtualRequests


@dataclass(frozen=True)
class Tiling:
    """A kernel's tile: ``rows`` (query rows, packed by the GQA group when ``packs_gqa``) by ``keys``."""

    rows: int
    keys: int
    packs_gqa: bool


TILINGS = {
    "triton": Tiling(128, 64, packs_gqa=False),
    "fa3": Tiling(128, 128, packs_gqa=True),
    "flashinfer": Tiling(128, 64, packs_gqa=True),
}


def _ceil(a: torch.Tensor | int, b: int):
    return -(-a // b)


def useful_pairs(vr: VirtualRequests) -> int:
    """(query row, key) pairs a plan's rows attend to: each row's admitted keys."""
    return int(vr.admitted.sum())


def executed_pairs(vr: VirtualRequests, tiling: Tiling, group: int) -> int:
    """(query row, key) pairs the kernel computes for ``vr`` per query head (``group``: query heads per KV
    head). Groups (masked) are SGLang's Triton kernel's whatever ``tiling`` says; runs use ``tiling``."""
    if vr.has_groups:
        return _triton_group_pairs(vr)
    rows, keys = vr.rows_per_request.tolist(), vr.keys_per_request.tolist()
    total = 0
    for m, k in zip(rows, keys):
        total += _run_pairs(m, k, tiling, group)
    return total


def _run_pairs(m: int, k: int, tiling: Tiling, group: int) -> int:
    """One run of ``m`` rows over ``k`` keys (its own rows last): per query head, causal bottom-right."""
    packed = tiling.rows // group if tiling.packs_gqa else tiling.rows  # query rows a tile holds
    prefix = k - m
    total = 0
    for start in range(0, m, packed):
        last = min(start + packed, m) - 1  # the tile's last row sees prefix + last + 1 keys
        total += packed * _ceil(prefix + last + 1, tiling.keys) * tiling.keys
    return total


def _triton_group_pairs(vr: VirtualRequests) -> int:
    """Masked groups through SGLang's Triton kernel: a 128-row tile per group and head, every key tile up to
    its last row's admitted keys (``SKIP_TILE`` skips the key tiles no row of the tile admits)."""
    tiling = TILINGS["triton"]
    admitted = vr.admitted
    total = 0
    bounds = vr.qo_indptr.tolist()
    for j in range(vr.num_requests):
        rows = admitted[bounds[j] : bounds[j + 1]]
        for start in range(0, rows.numel(), tiling.rows):
            tile_max = int(rows[start : start + tiling.rows].max())
            total += tiling.rows * _ceil(tile_max, tiling.keys) * tiling.keys
    return total


def causal_chunks_pairs(n: int, chunk: int, tiling: Tiling, group: int) -> tuple[int, int]:
    """(useful, executed) pairs per query head of ``n`` rows prefilled causally in chunks of ``chunk`` rows
    (SGLang's chunked prefill: each chunk is a run over the keys before it)."""
    useful = executed = 0
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        useful += m * lo + m * (m + 1) // 2
        executed += _run_pairs(m, lo + m, tiling, group)
    return useful, executed
