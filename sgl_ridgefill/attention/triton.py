"""RidgeFill on SGLang's Triton attention backend (``--attention-backend triton``).

A sub-pass step (``rowquery.py``) runs its groups through SGLang's Triton extend kernel under a device-built
mask and its runs as SGLang's own extend: each run reads its visible prefix from the pool and itself
causally (``metadata.triton_run_args``), with no mask. Outside a step, everything is SGLang's.

Decode steps of a finished nofill request read compacted key lists (``metadata.decode_kv_lists``) in the
layers whose filled rows hold nothing; everything else is the stock decode.

The subclass holds no state of its own beyond what it plans per forward, so ``patches.py`` turns the
backend SGLang builds into it by assigning ``__class__``.
"""

from __future__ import annotations

import dataclasses

from sglang.srt.layers.attention.triton_backend import ForwardMetadata, TritonAttnBackend

from .contract import hidden_keys, request
from .metadata import RUN_ARGS, decode_kv_lists
from .rowquery import RowQueryExtend


class RidgeFillTritonBackend(RowQueryExtend, TritonAttnBackend):
    ridgefill_visible_keys = True
    ridgefill_hidden_keys = True

    def init_forward_metadata(self, forward_batch):
        self._rf_decode = None
        return super().init_forward_metadata(forward_batch)

    def _rf_prepare_runs(self, runs, scope, sub_batch) -> ForwardMetadata:
        args = RUN_ARGS["triton"](runs, scope.slots)
        return ForwardMetadata(
            attn_logits=None,
            attn_lse=None,
            max_extend_len=int(args.max_extend_len),
            num_kv_splits=None,
            kv_indptr=args.kv_indptr,
            kv_indices=args.kv_indices,
            qo_indptr=args.qo_indptr,
            custom_mask=None,
            mask_indptr=None,
            window_kv_indptr=self.window_kv_indptr,
            window_kv_indices=None,
            window_num_kv_splits=None,
            window_kv_offsets=None,
        )

    # ------------------------------------------------------------------ decode
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        rids = forward_batch.rids or ()
        if not any(hidden_keys(rid, layer.layer_id) is not None for rid in rids):
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
        (cached per forward: every upper layer of one split shares them). Reads the lengths and request rows on
        the host (the batch's host copies, else each request's ``Req``), so building it does not wait for the
        device unless a request of the batch is neither (then one read of its rows)."""
        hidden = tuple(hidden_keys(rid, layer_id) is not None for rid in forward_batch.rids)
        cached = getattr(self, "_rf_decode", None)
        if cached is not None and cached[0] is forward_batch and cached[1] == hidden:
            return cached[2]
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = _host(forward_batch.seq_lens_cpu, forward_batch.seq_lens)
        req_rows = _request_rows(forward_batch)
        rows, visible = [], []
        for i, seq_len in enumerate(seq_lens):
            rows.append(req_to_token[req_rows[i], :seq_len])
            keys = hidden_keys(forward_batch.rids[i], layer_id)
            if keys is None:
                visible.append(None)
                continue
            mask = (~keys).new_ones(seq_len)
            mask[: keys.numel()] &= ~keys
            visible.append(mask)
        kv_indptr, kv_indices = decode_kv_lists(rows, visible)
        meta = dataclasses.replace(self.forward_metadata, kv_indptr=kv_indptr, kv_indices=kv_indices)
        self._rf_decode = (forward_batch, hidden, meta)
        return meta


def _host(host_copy, device_tensor) -> list[int]:
    """A batch field as host ints: its host copy where SGLang keeps one, else read from the device."""
    return (host_copy if host_copy is not None else device_tensor).tolist()


def _request_rows(forward_batch) -> list[int]:
    """The batch's rows of SGLang's request-to-token table on the host: its host copy (extend batches), else
    each request's ``Req`` (decode batches; RidgeFill knows the ``Req`` of its own requests), else read."""
    if forward_batch.req_pool_indices_cpu is not None:
        return forward_batch.req_pool_indices_cpu.tolist()
    reqs = [request(rid) for rid in forward_batch.rids]
    if all(req is not None and getattr(req, "req_pool_idx", None) is not None for req in reqs):
        return [int(req.req_pool_idx) for req in reqs]
    return forward_batch.req_pool_indices.tolist()
