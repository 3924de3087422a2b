"""``ridgefill_cpu``: a CPU attention backend whose extend costs new rows x context.

SGLang 0.5.23's ``torch_native`` extend (``_run_sdpa_forward_extend``) builds a query as long as the whole
sequence and runs full causal attention over it, so extending 1,024 rows over an 8K cached prefix costs
as much attention as the whole 8K prefill, and chunked prefill grows cubically with the prompt. This
backend keeps torch_native's KV writes, decode path and pool layout, and replaces the extend with
attention of the new rows only: a run of consecutive rows (a chunk, RidgeFill's tail) as a causal block over
its own keys merged with an unmasked pass over the keys before it; scattered rows in masked query blocks.

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

from .contract import current_row_queries, hidden_keys

BACKEND_NAME = "ridgefill_cpu"
# Query rows per masked SDPA call. torch's CPU flash kernel reads every key up to the block's last position
# for every row of the block, masked or not, so for a selection's scattered rows small blocks follow their
# positions: 64-row blocks attended the rows policy's 510 rows (windows of 17 over a 5K prefix) 1.5-1.8x as
# fast as 512-row blocks, its 1,530 rows over a 15K prefix about as fast (0.94-1.03x; AVX512 CPU, float32 and
# bfloat16, 2 threads: ``python -m sgl_ridgefill.bench.scattered_rows``). An unmasked call over the keys before
# each block, merged by log-sum-exp with a masked one over its span, was no faster.
QUERY_BLOCK = 64
# Consecutive rows from which one run goes through the two unmasked calls of ``_attend_run``.
MIN_RUN = 32


class RidgeFillCpuAttnBackend(TorchNativeAttnBackend):
    ridgefill_row_queries = True  # masks by position: groups and runs of one request in one call
    ridgefill_visible_keys = True
    ridgefill_hidden_keys = True
    ridgefill_hidden_keys_in_extend = True

    def ridgefill_prepare(self, scope, sub_batch) -> None:
        """Nothing to plan: the extend reads the step's positions and visible keys from the scope."""
        return None

    def ridgefill_activate(self, prepared) -> None:
        return None

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
            self._attend_rows(q_, o_, scope.slots, forward_batch.positions, scope.visible, layer,
                              pos_cpu=scope.step.positions.tolist())
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
            visible = _visible(hidden_keys(rid, layer.layer_id), seq_len, q.device)
            rows = slice(start, start + n)
            self._attend_rows(q_[rows], o_[rows], slots, forward_batch.positions[rows], visible, layer)
            start += n
        return o

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        rids = forward_batch.rids or ()
        hidden = [hidden_keys(rid, layer.layer_id) for rid in rids]
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

    def _attend_rows(self, q, out, slots, positions, visible, layer, pos_cpu: list[int] | None = None) -> None:
        """``q``/``out``: ``[n, heads, d]``; ``slots``: ``[seq_len]`` KV slots of the request's context;
        ``positions``: ``[n]`` query positions (ascending), ``pos_cpu`` the same as host ints (read from
        ``positions`` when not given); ``visible``: ``[seq_len]`` bool or None."""
        if pos_cpu is None:
            pos_cpu = positions.tolist()
        for lo, hi, whole in _segments(pos_cpu, all_visible=visible is None):
            if whole:
                self._attend_run(q[lo:hi], out[lo:hi], slots, pos_cpu[lo], layer)
            else:
                self._attend_masked(q[lo:hi], out[lo:hi], slots, positions[lo:hi], pos_cpu[lo:hi], visible, layer)

    def _kv(self, layer, slots, dtype):
        keys = self.token_to_kv_pool.get_key_buffer(layer.layer_id)[slots]
        values = self.token_to_kv_pool.get_value_buffer(layer.layer_id)[slots]
        return (keys.to(dtype), values.to(dtype)) if keys.dtype != dtype else (keys, values)

    def _attend_run(self, q, out, slots, first, layer) -> None:
        """Rows at positions ``first .. first+n-1``, every key visible: a causal call over their own keys
        (the diagonal block) and, after a prefix, an unmasked one over keys ``0 .. first-1``, merged by their
        log-sum-exp. Neither call takes a mask: for a 1,024-row tail over 8K and 16K keys (Qwen2.5-0.5B
        heads) masked query blocks took 1.2-1.9x as long, float32 and bfloat16 (AVX512 CPU;
        ``python -m sgl_ridgefill.bench.tail_attention``)."""
        n = q.shape[0]
        keys, values = self._kv(layer, slots[: first + n], q.dtype)
        qh = q.movedim(0, 1).unsqueeze(0)  # [1, heads, n, d]
        kh, vh = keys.movedim(0, 1).unsqueeze(0), values.movedim(0, 1).unsqueeze(0)
        diag, lse_diag = _flash(qh, kh[:, :, first:], vh[:, :, first:], causal=True, scale=layer.scaling)
        if first == 0:
            out.copy_(diag.squeeze(0).movedim(1, 0))
            return
        before, lse_before = _flash(qh, kh[:, :, :first], vh[:, :, :first], causal=False, scale=layer.scaling)
        w = torch.sigmoid(lse_before - lse_diag).unsqueeze(-1)  # the prefix's share of the softmax mass
        merged = diag.float() + w * (before.float() - diag.float())
        out.copy_(merged.squeeze(0).movedim(1, 0))

    def _attend_masked(self, q, out, slots, positions, pos_cpu, visible, layer) -> None:
        """Any rows, in blocks of ``QUERY_BLOCK`` queries over the keys up to each block's last position,
        masked by position and ``visible``."""
        gqa = layer.tp_q_head_num != layer.tp_k_head_num
        n = q.shape[0]
        for lo in range(0, n, QUERY_BLOCK):
            hi = min(n, lo + QUERY_BLOCK)
            kv_len = int(max(pos_cpu[lo:hi])) + 1
            keys, values = self._kv(layer, slots[:kv_len], q.dtype)
            key_pos = torch.arange(kv_len, device=q.device)
            mask = key_pos.unsqueeze(0) <= positions[lo:hi].unsqueeze(1)
            if visible is not None:
                mask &= visible[:kv_len].unsqueeze(0)
            # The mask stays 2-D ([rows, keys], broadcast over batch and heads): torch's CPU flash kernel
            # takes 2-D or 4-D masks only and silently falls back to the math path (fp32 upcast, full score
            # matrix, about 8x slower at 4K) for the 3-D [1, rows, keys] shape.
            res = scaled_dot_product_attention(
                q[lo:hi].movedim(0, 1).unsqueeze(0),
                keys.movedim(0, 1).unsqueeze(0),
                values.movedim(0, 1).unsqueeze(0),
                attn_mask=mask,
                scale=layer.scaling,
                enable_gqa=gqa,
            )
            out[lo:hi] = res.squeeze(0).movedim(1, 0)


def _flash(q, k, v, *, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU flash attention with its log-sum-exp (``[1, heads, n, d]``, ``[1, heads, n]`` float32);
    grouped K/V heads are read as they are."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _segments(pos: list[int], *, all_visible: bool) -> list[tuple[int, int, bool]]:
    """Query rows ``[lo, hi)`` to attend together, and whether they are one run of consecutive positions
    long enough (``MIN_RUN``, or starting at position 0) for :meth:`_attend_run`. Other rows (a
    selection's scattered exact rows, any rows when some keys are hidden) go to the masked path."""
    segments: list[tuple[int, int, bool]] = []
    pending = None  # first row of the masked segment being collected
    lo = 0
    while lo < len(pos):
        hi = lo + 1
        while hi < len(pos) and pos[hi] == pos[hi - 1] + 1:
            hi += 1
        if all_visible and (hi - lo >= MIN_RUN or pos[lo] == 0):
            if pending is not None:
                segments.append((pending, lo, False))
                pending = None
            segments.append((lo, hi, True))
        elif pending is None:
            pending = lo
        lo = hi
    if pending is not None:
        segments.append((pending, len(pos), False))
    return segments


def _visible(hidden: torch.Tensor | None, seq_len: int, device) -> torch.Tensor | None:
    """Visible keys ``[seq_len]`` from a request's hidden prefix keys (``[B]``, True = hidden)."""
    if hidden is None:
        return None
    visible = torch.ones(seq_len, dtype=torch.bool, device=device)
    visible[: hidden.numel()] &= ~hidden.to(device)
    return visible
