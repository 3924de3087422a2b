"""How RidgeFill's GPU backends run one step of a sub-pass: groups through SGLang's Triton extend kernel, runs
through the backend's own extend.

A step (``steps.Step``) holds groups of scattered exact rows and runs (the tail, windows). Runs are what a
stock extend computes, so each backend keeps its own kernel for them, unmasked (Triton's extend, FlashInfer's
paged prefill, fa3's ``flash_attn_with_kvcache``). Groups need a mask ``key_pos <= q_pos``; on every backend
they go through SGLang's Triton ``extend_attention_fwd`` (shipped with every SGLang install), with the mask
built on the device (``metadata.triton_group_args``). fa3 has no custom mask at all, so this is also how fa3
runs scattered rows at their useful cost instead of one 128-row tile per single-row run. Why SGLang's kernel
rather than a kernel of RidgeFill's own: it skips the key tiles the mask hides, so a 128-row group of a 10 %
selection reads its keys once, and its mask costs ``rows x keys`` bytes per group, under 2 % of the group's
attention time at the 8B shapes of ``docs/GPU_ESTIMATES.md``.

A step is prepared once (:meth:`RowQueryExtend.ridgefill_prepare`: one metadata initialisation) and activated
for every upper layer (:meth:`RowQueryExtend.ridgefill_activate`: attribute assignments). In a step with
groups, ``forward_extend`` writes every row's K/V first, so groups and runs read each other's rows of this
layer from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .. import ledger
from .contract import RowQueries, current_row_queries
from .metadata import TritonExtendArgs, triton_group_args


@dataclass(frozen=True)
class PreparedStep:
    """A step's metadata: its groups' Triton arguments, how many rows they hold, the runs' backend metadata."""

    groups: TritonExtendArgs | None
    group_rows: int
    runs: Any


def run_groups(pool, layer, q, k, v, o, args: TritonExtendArgs) -> None:
    """SGLang's Triton extend kernel for a step's groups, called as SGLang's Triton backend calls it (softcap,
    K/V scales); ``q``/``o``: ``[g, heads * d]``, ``k``/``v`` the groups' rows (only their shapes are read:
    ``skip_extend`` reads every key from the pool)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod

    if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
        raise ValueError(f"layer {layer.layer_id} has a sliding window, which RidgeFill's groups do not apply")
    heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
    cap = logit_capping_mod(layer.logit_capping_method, layer.logit_cap) if layer.logit_cap else 0.0
    scaled = layer.k_scale is not None and layer.v_scale is not None
    extend_attention_fwd(
        q.reshape(-1, heads, layer.qk_head_dim), k.reshape(-1, kv_heads, layer.qk_head_dim),
        v.reshape(-1, kv_heads, layer.v_head_dim), o.view(-1, heads, layer.v_head_dim),
        pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
        args.qo_indptr, args.kv_indptr, args.kv_indices, args.mask(), True, args.mask_indptr,
        args.max_extend_len, layer.k_scale_float if scaled else 1.0, layer.v_scale_float if scaled else 1.0,
        layer.scaling, logit_cap=cap,
        skip_prefix_custom_mask=args.skip_prefix_custom_mask, skip_extend=args.skip_extend, page_size=1,
    )


class RowQueryExtend(AttentionBackend):
    """The row-query side of RidgeFill's GPU backends; the first base class, before SGLang's backend (a
    subclass of SGLang's base class with no slots of its own, so the subclass keeps SGLang's layout).

    A subclass implements ``_rf_prepare_runs(runs, scope, sub_batch)``: the backend's metadata for the step's
    runs, installed as its ``forward_metadata`` by :meth:`ridgefill_activate`."""

    __slots__ = ()  # adds nothing to the layout: ``patches.py`` turns SGLang's instance into the subclass
    ridgefill_row_queries = True
    _rf_step: PreparedStep | None = None

    def ridgefill_prepare(self, scope: RowQueries, sub_batch) -> PreparedStep:
        ledger.count(ledger.METADATA_INITS)
        step = scope.step
        if step.index == 0:
            self._rf_begin_pass(step.count)
        groups = triton_group_args(step.groups, scope.slots) if step.groups is not None else None
        runs = self._rf_prepare_runs(step.runs, scope, sub_batch) if step.runs is not None else None
        return PreparedStep(groups, step.group_rows, runs)

    def _rf_begin_pass(self, steps: int) -> None:
        """A new pass of ``steps`` steps is about to be prepared (a backend that keeps per-step state resets it)."""

    def ridgefill_activate(self, prepared: PreparedStep) -> None:
        self._rf_step = prepared
        if prepared.runs is not None:
            self.forward_metadata = prepared.runs

    def init_forward_metadata(self, forward_batch):
        """SGLang's own planning (lower pass, exact requests, the batch after RidgeFill's passes)."""
        self._rf_step = None
        return super().init_forward_metadata(forward_batch)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        step = self._rf_step
        if step is None or step.groups is None or current_row_queries() is None:
            # SGLang's extend: a plain batch, or a step of runs only with the runs' metadata in place.
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        rows = q.shape[0]
        k = k.view(rows, layer.tp_k_head_num, layer.qk_head_dim)
        v = v.view(rows, layer.tp_v_head_num, layer.v_head_dim)
        if save_kv_cache:  # groups read their own rows, and runs read the groups', from the pool
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v,
                                                layer.k_scale, layer.v_scale)
        o = q.new_empty((rows, layer.tp_q_head_num * layer.v_head_dim))
        g = step.group_rows
        run_groups(self.token_to_kv_pool, layer, q[:g], k[:g], v[:g], o[:g], step.groups)
        if g < rows:
            runs = super().forward_extend(q[g:], k[g:], v[g:], layer, forward_batch, save_kv_cache=False, **kwargs)
            o[g:] = runs.view(rows - g, -1)
        return o
