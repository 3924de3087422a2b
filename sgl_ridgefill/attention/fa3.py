"""RidgeFill on SGLang's FlashAttention-3 backend (``--attention-backend fa3``, the default on Hopper).

Under a :class:`~sgl_ridgefill.attention.contract.RowQueries` scope, ``init_forward_metadata`` describes
the sub-pass's virtual requests through the kernel's own inputs (``planner.fa3_args``): one page-table row
per request holding its visible key slots up to its last row (own rows included), ``cache_seqlens`` =
their count, and the query layout in ``cu_seqlens_q``. ``flash_attn_with_kvcache`` aligns its causal
mask bottom-right, so each run sees exactly the visible keys at or before each of its rows; the stock
``forward_extend`` then runs unchanged (it writes the rows' K/V before attention).

What fa3 cannot express, RidgeFill does not ask of it: the kernel takes no custom mask, so there is no
grouped mode (scattered rows run as one virtual request per run, at most ``PassContext.max_virtual`` per
step); with a page size above 1 the page table holds pages, not token slots, so visible-key masks (the
nofill arm and the probe) are refused there; decode steps of nofill requests are not re-planned, so the
nofill arm is refused on this backend.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend, FlashAttentionMetadata

from .contract import current_row_queries
from .planner import fa3_args


class RidgeFillFa3Backend(FlashAttentionBackend):
    ridgefill_row_queries = True
    ridgefill_groups = False
    ridgefill_hidden_keys = False

    @property
    def ridgefill_visible_keys(self) -> bool:
        """Compacted key lists need a page table of token slots: page size 1."""
        return self.page_size == 1

    def init_forward_metadata(self, forward_batch):
        scope = current_row_queries()
        if scope is None or not forward_batch.forward_mode.is_extend():
            return super().init_forward_metadata(forward_batch)
        args = fa3_args(scope.plan, scope.slots, page_size=self.page_size)
        metadata = FlashAttentionMetadata()
        metadata.cache_seqlens_int32 = args.cache_seqlens
        metadata.cu_seqlens_q = args.cu_seqlens_q
        metadata.cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(args.cache_seqlens, 0, dtype=torch.int32), (1, 0))
        metadata.max_seq_len_q = int(args.max_seqlen_q)
        metadata.max_seq_len_k = int(args.max_seqlen_k)
        metadata.page_table = args.page_table
        self.forward_metadata = metadata
