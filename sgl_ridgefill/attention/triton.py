"""RidgeFill on SGLang's Triton attention backend (``--attention-backend triton``).

Under a :class:`~sgl_ridgefill.attention.contract.RowQueries` scope, ``init_forward_metadata`` plans the
sub-pass's virtual requests itself (``planner.triton_extend_args``): runs of consecutive rows read their
visible prefix from the pool and themselves causally, exactly SGLang's extend; groups of scattered rows
read every visible key up to their last row from the pool (their own K/V is written before attention)
under a custom mask ``key_pos <= q_pos``. One launch takes a custom mask for all its requests or for
none, so in a plan with groups every request reads its keys from the pool under the mask. Without a
scope, everything is SGLang's.

Decode steps of a finished nofill request read compacted key lists (``planner.decode_kv_lists``) in the
layers whose filled rows hold nothing; everything else is the stock decode.

The subclass holds no state of its own beyond what it plans per forward, so ``patches.py`` turns the
backend SGLang builds into it by assigning ``__class__``.
"""

from __future__ import annotations

import dataclasses

import torch

from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_backend import ForwardMetadata, TritonAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ..runtime.state import LIVE
from .contract import current_row_queries
from .planner import decode_kv_lists, triton_extend_args


class RidgeFillTritonBackend(TritonAttnBackend):
    ridgefill_row_queries = True
    ridgefill_visible_keys = True
    ridgefill_groups = True
    ridgefill_hidden_keys = True

    # ------------------------------------------------------------------ extend
    def init_forward_metadata(self, forward_batch):
        self._rf_masked = None
        self._rf_decode = None
        scope = current_row_queries()
        if scope is None or not forward_batch.forward_mode.is_extend():
            return super().init_forward_metadata(forward_batch)
        args = triton_extend_args(scope.plan, scope.slots)
        self.forward_metadata = ForwardMetadata(
            attn_logits=None,
            attn_lse=None,
            max_extend_len=int(args.max_extend_len),
            num_kv_splits=None,
            kv_indptr=args.kv_indptr,
            kv_indices=args.kv_indices,
            qo_indptr=args.qo_indptr,
            custom_mask=args.custom_mask,
            mask_indptr=args.mask_indptr,
            window_kv_indptr=self.window_kv_indptr,
            window_kv_indices=None,
            window_num_kv_splits=None,
            window_kv_offsets=None,
        )
        if args.custom_mask is not None:
            self._rf_masked = args  # SGLang's forward_extend launches without the mask flags: ours does

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        args = getattr(self, "_rf_masked", None)
        if args is None or current_row_queries() is None:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        # Groups read their own rows from the pool: every row's K/V is written first.
        if save_kv_cache:
            self._set_kv_buffer(forward_batch, layer, KVWriteLoc.for_batch(forward_batch), k, v)
        heads, dv = layer.tp_q_head_num, layer.v_head_dim
        o = q.new_empty((q.shape[0], heads, dv))
        extend_attention_fwd(
            q.view(-1, heads, layer.qk_head_dim), k.contiguous(), v.contiguous(), o,
            self.token_to_kv_pool.get_key_buffer(layer.layer_id), self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            args.qo_indptr, args.kv_indptr, args.kv_indices, args.custom_mask, True, args.mask_indptr,
            args.max_extend_len, 1.0, 1.0, layer.scaling,
            skip_prefix_custom_mask=args.skip_prefix_custom_mask, skip_extend=args.skip_extend, page_size=self.page_size,
        )
        return o.view(-1, heads * dv)

    # ------------------------------------------------------------------ decode
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        rids = forward_batch.rids or ()
        if not any(LIVE.hidden_keys(rid, layer.layer_id) is not None for rid in rids):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        stock, lean = self.forward_metadata, self.enable_lean_attention
        self.forward_metadata = self._decode_metadata(forward_batch, layer.layer_id)
        self.enable_lean_attention = False  # the lean kernel sizes its work from the uncompacted lengths
        try:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
        finally:
            self.forward_metadata, self.enable_lean_attention = stock, lean

    def _decode_metadata(self, forward_batch, layer_id: int) -> ForwardMetadata:
        """The decode metadata with compacted key lists for the requests that hide keys at ``layer_id``
        (cached per forward: every upper layer of one split shares them)."""
        hidden = tuple(LIVE.hidden_keys(rid, layer_id) is not None for rid in forward_batch.rids)
        cached = getattr(self, "_rf_decode", None)
        if cached is not None and cached[0] is forward_batch and cached[1] == hidden:
            return cached[2]
        req_to_token = self.req_to_token_pool.req_to_token
        rows, visible = [], []
        for i, seq_len in enumerate(forward_batch.seq_lens.tolist()):
            rows.append(req_to_token[forward_batch.req_pool_indices[i], :seq_len])
            keys = LIVE.hidden_keys(forward_batch.rids[i], layer_id)
            if keys is None:
                visible.append(None)
                continue
            mask = torch.ones(seq_len, dtype=torch.bool)
            mask[: keys.numel()] &= ~keys.cpu()
            visible.append(mask)
        kv_indptr, kv_indices = decode_kv_lists(rows, visible)
        meta = dataclasses.replace(self.forward_metadata, kv_indptr=kv_indptr, kv_indices=kv_indices)
        self._rf_decode = (forward_batch, hidden, meta)
        return meta
