"""RidgeFill on SGLang's FlashAttention-3 backend (``--attention-backend fa3``, the default on Hopper).

A sub-pass step (``rowquery.py``) runs its runs through the kernel's own inputs (``metadata.fa3_args``): one
page-table row per run holding its visible key slots up to its last row (own rows included),
``cache_seqlens`` = their count, and the query layout in ``cu_seqlens_q``. ``flash_attn_with_kvcache`` aligns
its causal mask bottom-right, so each run sees exactly the visible keys at or before each of its rows; the
stock ``forward_extend`` then runs unchanged. The kernel takes no custom mask, so the step's groups of
scattered rows go through SGLang's Triton extend kernel instead (``rowquery.run_groups``), which packs up to
a tile of them into one virtual request: fa3 would spend a 128-row tile on every single-row run.

With a page size above 1 the page table holds pages, not token slots, so visible-key masks (the nofill arm
and the probe) are refused there; decode steps of nofill requests are not re-planned, so the nofill arm is
refused on this backend.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend, FlashAttentionMetadata

from .metadata import RUN_ARGS
from .rowquery import RowQueryExtend


class RidgeFillFa3Backend(RowQueryExtend, FlashAttentionBackend):
    ridgefill_hidden_keys = False

    @property
    def ridgefill_visible_keys(self) -> bool:
        """Compacted key lists need a page table of token slots: page size 1."""
        return self.page_size == 1

    def _rf_prepare_runs(self, runs, scope, sub_batch) -> FlashAttentionMetadata:
        args = RUN_ARGS["fa3"](runs, scope.slots, page_size=self.page_size)
        metadata = FlashAttentionMetadata()
        metadata.cache_seqlens_int32 = args.cache_seqlens
        metadata.cu_seqlens_q = args.cu_seqlens_q
        metadata.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(args.cache_seqlens, 0, dtype=torch.int32), (1, 0))
        metadata.max_seq_len_q = int(args.max_seqlen_q)
        metadata.max_seq_len_k = int(args.max_seqlen_k)
        metadata.page_table = args.page_table
        return metadata
