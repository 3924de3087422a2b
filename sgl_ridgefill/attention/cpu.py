"""``ridgefill_cpu``: a CPU attention backend whose extend costs new rows x context.

SGLang 0.5.23's ``torch_native`` extend (``_run_sdpa_forward_extend``) builds a query as long as the whole
sequence and runs full causal attention over it, so extending 1,024 rows over an 8K cached prefix costs
as much attention as the whole 8K prefill, and chunked prefill grows cubically with the prompt. This
backend keeps torch_native's KV writes, decode path and pool layout, and replaces the extend with
attention of the new rows only, in query blocks, each block over the keys up to its last position.

It serves RidgeFill's row queries (``contract.py``) directly: the causal mask comes from
``forward_batch.positions``, so a sub-pass's virtual requests (all rows of one request) run as one call
over the request's context, with the scope's visible-key mask. Requests whose nofill prefill finished
skip their hidden keys in decode steps and in extends that carry their rows (mixed batches). For a stock
extend (rows ``prefix .. prefix+n-1``) the result is the attention torch_native computes.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from ..runtime.state import LIVE
from .contract import current_row_queries

BACKEND_NAME = "ridgefill_cpu"
# Query rows per SDPA call: bounds the [heads, rows, keys] score block (torch's CPU kernel tiles further).
QUERY_BLOCK = 512


class RidgeFillCpuAttnBackend(TorchNativeAttnBackend):
    ridgefill_row_queries = True
    ridgefill_visible_keys = True
    ridgefill_groups = True  # masks by position: any rows of one request in one call
    ridgefill_hidden_keys = True
    ridgefill_hidden_keys_in_extend = True

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if (
            layer.is_cross_attention
            or layer.attn_type == AttentionType.ENCODER_ONLY
            or forward_batch.encoder_lens is not None
            or (layer.sliding_window_size is not None and layer.sliding_window_size > -1)
            or forward_batch.positions is None
            or forward_batch.positions.dim() != 1
        ):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)

        if save_kv_cache and k is not None and v is not None:
            self._write(layer, forward_batch, k, v)
        o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        q_ = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o_ = o.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        scope = current_row_queries()
        if scope is not None:
            # Every row of the sub-pass belongs to one request: one call over its context.
            self._attend_rows(q_, o_, scope.slots, forward_batch.positions, scope.visible, layer)
            return o
        req_to_token = self.req_to_token_pool.req_to_token
        seq_lens = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else forward_batch.seq_lens.cpu()
        start = 0
        for i in range(forward_batch.batch_size):
            n = int(forward_batch.extend_seq_lens_cpu[i])
            if n == 0:
                continue
            seq_len = int(seq_lens[i])
            slots = req_to_token[forward_batch.req_pool_indices[i], :seq_len]
            rid = forward_batch.rids[i] if forward_batch.rids else None
            visible = _visible(LIVE.hidden_keys(rid, layer.layer_id), seq_len, q.device)
            rows = slice(start, start + n)
            self._attend_rows(q_[rows], o_[rows], slots, forward_batch.positions[rows], visible, layer)
            start += n
        return o

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        rids = forward_batch.rids or ()
        hidden = [LIVE.hidden_keys(rid, layer.layer_id) for rid in rids]
        if all(h is None for h in hidden) or layer.is_cross_attention or forward_batch.encoder_lens is not None:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        # A nofill request: its filled rows hold nothing in the upper layers, so its decode queries skip them.
        if save_kv_cache and k is not None and v is not None:
            self._write(layer, forward_batch, k, v)
        q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = q.new_empty((q_.shape[0], layer.tp_q_head_num * layer.v_head_dim))
        o_ = o.view(-1, layer.tp_q_head_num, layer.v_head_dim)
        for i, seq_len in enumerate(forward_batch.seq_lens.tolist()):
            slots = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices[i], :seq_len]
            pos = torch.tensor([seq_len - 1], device=q.device)
            visible = _visible(hidden[i], seq_len, q.device)
            self._attend_rows(q_[i : i + 1], o_[i : i + 1], slots, pos, visible, layer)
        return o

    def _write(self, layer, forward_batch, k, v) -> None:
        loc = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc, physical=forward_batch.out_cache_loc_is_physical)
        self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)

    def _attend_rows(self, q, out, slots, positions, visible, layer) -> None:
        """``q``/``out``: ``[n, heads, d]``; ``slots``: ``[seq_len]`` KV slots of the request's context;
        ``positions``: ``[n]`` query positions (ascending); ``visible``: ``[seq_len]`` bool or None."""
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        gqa = layer.tp_q_head_num != layer.tp_k_head_num
        pos_cpu = positions.tolist()
        n = q.shape[0]
        # Rows 0..n-1 of a request (a whole prompt in one chunk, or RidgeFill's lower pass over it): one
        # causal call lets the flash kernel skip the masked half of the scores; 512-row blocks with masks
        # spend about twice the attention time at 8K tokens. The kernel tiles internally, so no score
        # matrix is materialised either way.
        block = n if visible is None and pos_cpu[0] == 0 and pos_cpu[-1] == n - 1 else QUERY_BLOCK
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            kv_len = int(max(pos_cpu[lo:hi])) + 1
            keys = k_cache[slots[:kv_len]]
            values = v_cache[slots[:kv_len]]
            qb = q[lo:hi]
            if keys.dtype != qb.dtype:
                keys, values = keys.to(qb.dtype), values.to(qb.dtype)
            contiguous = pos_cpu[hi - 1] - pos_cpu[lo] == hi - lo - 1 and pos_cpu[hi - 1] == kv_len - 1
            mask = None
            if visible is not None or not contiguous:
                key_pos = torch.arange(kv_len, device=q.device)
                mask = key_pos.unsqueeze(0) <= positions[lo:hi].unsqueeze(1)
                if visible is not None:
                    mask &= visible[:kv_len].unsqueeze(0)
            elif hi - lo != kv_len:
                # Contiguous rows at the end of the context: causal with the diagonal offset by the prefix.
                prefix = kv_len - (hi - lo)
                mask = torch.ones((hi - lo, kv_len), dtype=torch.bool, device=q.device).tril_(prefix)
            # The mask stays 2-D ([rows, keys], broadcast over batch and heads): torch's CPU flash kernel
            # takes 2-D or 4-D masks only and silently falls back to the math path (fp32 upcast, full score
            # matrix, about 8x slower at 4K) for the 3-D [1, rows, keys] shape.
            res = scaled_dot_product_attention(
                qb.movedim(0, 1).unsqueeze(0),
                keys.movedim(0, 1).unsqueeze(0),
                values.movedim(0, 1).unsqueeze(0),
                attn_mask=mask,
                is_causal=mask is None,
                scale=layer.scaling,
                enable_gqa=gqa,
            )
            out[lo:hi] = res.squeeze(0).movedim(1, 0)


def _visible(hidden: torch.Tensor | None, seq_len: int, device) -> torch.Tensor | None:
    """Visible keys ``[seq_len]`` from a request's hidden prefix keys (``[B]``, True = hidden)."""
    if hidden is None:
        return None
    visible = torch.ones(seq_len, dtype=torch.bool, device=device)
    visible[: hidden.numel()] &= ~hidden.to(device)
    return visible
