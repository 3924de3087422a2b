"""RidgeFill's FlashInfer and fa3 backends without CUDA: a sub-pass step is prepared once and run through
SGLang's own ``forward_extend`` for its runs and SGLang's Triton extend launcher for its groups, against
PyTorch emulators of the kernels (``tests/support/attention_emulators.py``).

None of these kernels runs on a plain CPU, so a recording fake stands in for FlashInfer's paged prefill
wrapper (its ``forward`` emulates FlashInfer's paged semantics: keys from the pool, causal aligned
bottom-right), the emulator replaces ``flash_attn_with_kvcache`` in SGLang's fa3 module, and the Triton
extend emulator replaces SGLang's ``extend_attention_fwd`` for the groups. The subclasses, SGLang's extend
code around the kernel calls, the step planner and the metadata builders run for real; every case is
compared with a direct masked softmax over the visible keys at or before each query's position.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.attention.contract import RowQueries, row_queries
from sgl_ridgefill.attention.steps import plan_steps
from tests.support.attention_emulators import (
    fa3_kvcache_emulator,
    flashinfer_paged_emulator,
    reference_attention,
    triton_extend_emulator,
)

HEADS, KV_HEADS, D, SEQ, SLOTS = 4, 2, 16, 96, 160


@pytest.fixture(autouse=True, scope="module")
def _cpu_sglang():
    """SGLang's attention modules import sgl_kernel: the CPU stand-in goes first."""
    from sgl_ridgefill.cpu.environment import apply_cpu_environment

    apply_cpu_environment()

SCALE = D**-0.5
TAIL_START = 80

# (name, query positions, visible keys or None, group size (None: every row in runs), rows per step)
CASES = [
    ("tail", list(range(80, SEQ)), None, None, 64),
    ("scattered_rows_as_runs_and_tail", [3, 9, 10, 11, 30, 47, 61] + list(range(80, SEQ)), None, None, 64),
    ("grouped_rows_and_tail", [3, 9, 10, 11, 30, 47, 61] + list(range(80, SEQ)), None, 4, 64),
    ("grouped_rows_and_tail_in_steps", [3, 9, 10, 11, 30, 47, 61] + list(range(80, SEQ)), None, 4, 5),
    ("nofill_grouped_visible_keys", [5, 40, 41] + list(range(80, SEQ)), "nofill", 2, 64),
    ("probe_visible_keys", list(range(88, SEQ)), "probe", None, 64),
]
IDS = [c[0] for c in CASES]


class _Pool:
    def __init__(self, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.k = torch.randn(SLOTS, KV_HEADS, D, generator=gen)
        self.v = torch.randn(SLOTS, KV_HEADS, D, generator=gen)
        self.writes = 0

    def set_kv_buffer(self, layer, loc, k, v, *args, **kwargs):
        self.writes += 1
        self.k[loc.loc] = k.view(-1, KV_HEADS, D)
        self.v[loc.loc] = v.view(-1, KV_HEADS, D)

    def get_kv_buffer(self, layer_id):
        return self.k, self.v

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def _visible(kind) -> torch.Tensor | None:
    if kind is None:
        return None
    visible = torch.ones(SEQ, dtype=torch.bool)
    if kind == "nofill":
        visible[:80] = False
        visible[[5, 40, 41]] = True
    else:  # the probe: the tail rows before the probe rows hold nothing yet
        visible[80:88] = False
    return visible


def _layer():
    return SimpleNamespace(layer_id=3, tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, tp_v_head_num=KV_HEADS,
                           head_dim=D, qk_head_dim=D, v_head_dim=D, scaling=SCALE, logit_cap=0.0,
                           is_cross_attention=False, attn_type=None, sliding_window_size=-1, k_scale=None,
                           v_scale=None, k_scale_float=1.0, v_scale_float=1.0)


def _sub_batch(step, slots):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    pos = step.positions
    return SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=step.num_requests, positions=pos,
                           out_cache_loc=slots[pos], out_cache_loc_is_physical=True, encoder_lens=None,
                           extend_num_tokens=pos.numel(), extend_seq_lens_cpu=step.lens,
                           input_ids=torch.zeros(pos.numel(), dtype=torch.long), spec_info=None,
                           mha_one_shot=False, attn_attend_prefix_cache=False)


@pytest.fixture(autouse=True)
def _triton_groups_emulated(monkeypatch):
    """SGLang's Triton extend launcher, as the groups call it, replaced by its emulator."""
    import sglang.kernels.ops.attention.extend_attention as extend_module

    calls = []

    def extend_attention_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                             is_causal, mask_indptr, max_len_extend, k_scale, v_scale, sm_scale=None, *,
                             skip_prefix_custom_mask=True, skip_extend=False, page_size=1, **kwargs):
        assert page_size == 1 and custom_mask is not None and custom_mask.dtype == torch.uint8
        calls.append(int(qo_indptr.numel() - 1))
        o.copy_(triton_extend_emulator(q, k, v, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask,
                                       mask_indptr, sm_scale, is_causal=is_causal,
                                       skip_prefix_custom_mask=skip_prefix_custom_mask, skip_extend=skip_extend))

    monkeypatch.setattr(extend_module, "extend_attention_fwd", extend_attention_fwd)
    return calls


def _steps(positions, visible, group, step_rows):
    return plan_steps(torch.tensor(positions), visible, chunk_rows=step_rows, group_size=group or 4,
                      runs_from=TAIL_START if group is not None else None)


def _run_steps(backend, steps, slots, q, k, v) -> torch.Tensor:
    """Every step prepared once, then run as one upper layer would run it; the steps' outputs in row order."""
    prepared = []
    for step in steps:
        scope = RowQueries(step, slots, None, None)
        prepared.append((scope, backend.ridgefill_prepare(scope, _sub_batch(step, slots))))
    outs = []
    for (scope, p), step in zip(prepared, steps):
        with row_queries(scope):
            backend.ridgefill_activate(p)
            rows = step.rows
            outs.append(backend.forward_extend(q[rows], k[rows], v[rows], _layer(), _sub_batch(step, slots)))
    return torch.cat(outs)


def _inputs(name, positions):
    gen = torch.Generator().manual_seed(len(name))
    slots = torch.randperm(SLOTS, generator=gen)[:SEQ]
    n = len(positions)
    q = torch.randn(n, HEADS * D, generator=gen)
    k = torch.randn(n, KV_HEADS * D, generator=gen)
    v = torch.randn(n, KV_HEADS * D, generator=gen)
    return slots, q, k, v


def _expected(pool, slots, q, k, v, positions, visible):
    k_pool, v_pool = pool.k.clone(), pool.v.clone()
    k_pool[slots[positions]] = k.view(-1, KV_HEADS, D)  # every row's K/V is written before attention
    v_pool[slots[positions]] = v.view(-1, KV_HEADS, D)
    return reference_attention(q.view(-1, HEADS, D), k_pool, v_pool, slots, positions, visible, SCALE)


# ------------------------------------------------------------------------------------------ FlashInfer
class _PagedWrapper:
    """Records ``begin_forward``; ``forward`` emulates FlashInfer's paged prefill with the planned indices."""

    def __init__(self):
        self.plans = []

    def begin_forward(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads,
                      head_dim, page_size, **kwargs):
        assert page_size == 1 and (num_qo_heads, num_kv_heads, head_dim) == (HEADS, KV_HEADS, D)
        assert kwargs.get("non_blocking") is True
        plan = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)
        if kwargs.get("custom_mask") is not None:
            plan["custom_mask"] = kwargs["custom_mask"]
        self.plans.append(plan)

    def forward(self, q, kv_cache, *, causal=True, sm_scale=None, **kwargs):
        plan = self.plans[-1]
        k_pool, v_pool = kv_cache
        return flashinfer_paged_emulator(q, k_pool, v_pool, plan["qo_indptr"], plan["kv_indptr"], plan["kv_indices"],
                                         plan["kv_last_page_len"], plan.get("custom_mask"), sm_scale, causal=causal)


def _flashinfer_backend(pool):
    from sgl_ridgefill.attention.flashinfer import RidgeFillFlashInferBackend

    backend = RidgeFillFlashInferBackend.__new__(RidgeFillFlashInferBackend)
    backend.indices_updater_prefill = SimpleNamespace(num_qo_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=D,
                                                      q_data_type=torch.float32, data_type=torch.float32)
    backend.prefill_wrappers_paged = [_PagedWrapper()]
    backend._rf_new_wrapper = _PagedWrapper  # RidgeFill's own wrapper per step, as FlashInfer's would be made
    backend.token_to_kv_pool = pool
    backend.prefill_uses_dequant_workspace = False
    backend.num_wrappers = 1
    backend.kv_cache_quant_method = SimpleNamespace(needs_global_scale=lambda: False)
    return backend


@pytest.mark.parametrize("name, positions, visible_kind, group, step_rows", CASES, ids=IDS)
def test_flashinfer_paged_plan_runs_every_case_exactly(name, positions, visible_kind, group, step_rows,
                                                       _triton_groups_emulated):
    pool = _Pool()
    backend = _flashinfer_backend(pool)
    positions_t = torch.tensor(positions)
    visible = _visible(visible_kind)
    slots, q, k, v = _inputs(name, positions)
    want = _expected(pool, slots, q, k, v, positions_t, visible)
    steps = _steps(positions, visible, group, step_rows)
    out = _run_steps(backend, steps, slots, q, k, v)
    assert backend.forward_metadata.use_ragged is False  # the paged path: K/V written before attention
    assert pool.writes == len(steps)
    torch.testing.assert_close(out.view(-1, HEADS, D), want, atol=1e-5, rtol=1e-5)
    runs = [s for s in steps if s.runs is not None]
    plans = [w.plans for w in backend.__dict__.get("_rf_wrappers", [])]
    assert sum(len(p) for p in plans) == len(runs)  # each step planned once, on a wrapper of its own
    assert all("custom_mask" not in plan for p in plans for plan in p)  # runs carry no mask
    assert len(_triton_groups_emulated) == sum(s.groups is not None for s in steps)


def test_flashinfer_without_a_scope_is_sglang_planning(monkeypatch):
    """Plain batches (the lower pass, exact requests) keep SGLang's own plan."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    calls = []
    monkeypatch.setattr(FlashInferAttnBackend, "init_forward_metadata", lambda self, fb: calls.append(fb))
    backend = _flashinfer_backend(_Pool())
    fb = SimpleNamespace(forward_mode=None)
    backend.init_forward_metadata(fb)
    assert calls == [fb] and backend.prefill_wrappers_paged[0].plans == [] and not backend.__dict__.get("_rf_wrappers")


# ------------------------------------------------------------------------------------------ fa3
def _fa3_backend(pool, page_size):
    from sgl_ridgefill.attention.fa3 import RidgeFillFa3Backend

    backend = RidgeFillFa3Backend.__new__(RidgeFillFa3Backend)
    attrs = dict(token_to_kv_pool=pool, page_size=page_size, fa_skip_kv_cache=False, use_mla=False,
                 use_sliding_window_kv_pool=False, local_attn_builder=None, topk=0, fa_impl_ver=3,
                 kv_cache_is_mxfp8=False, kv_cache_dtype_str="auto", num_splits=0, full_cg_prefill_metadata=None,
                 has_swa=False, kv_cache_dtype=torch.float32)
    for key, value in attrs.items():
        setattr(backend, key, value)
    return backend


@pytest.mark.parametrize("name, positions, visible_kind, group, step_rows", CASES, ids=IDS)
def test_fa3_page_table_plan_runs_every_case_exactly(name, positions, visible_kind, group, step_rows, monkeypatch,
                                                     _triton_groups_emulated):
    import sglang.srt.layers.attention.flashattention_backend as fa3_module

    seen = []

    def flash_attn_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, softmax_scale,
                                causal, **kwargs):
        seen.append(page_table)
        return fa3_kvcache_emulator(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, softmax_scale,
                                    causal=causal)

    monkeypatch.setattr(fa3_module, "flash_attn_with_kvcache", flash_attn_with_kvcache)
    pool = _Pool()
    backend = _fa3_backend(pool, page_size=1)
    positions_t = torch.tensor(positions)
    visible = _visible(visible_kind)
    slots, q, k, v = _inputs(name, positions)
    want = _expected(pool, slots, q, k, v, positions_t, visible)
    steps = _steps(positions, visible, group, step_rows)
    out = _run_steps(backend, steps, slots, q, k, v)
    runs = [s.runs for s in steps if s.runs is not None]
    assert [t.shape[0] for t in seen] == [r.num_requests for r in runs]  # one page-table row per run
    assert len(_triton_groups_emulated) == sum(s.groups is not None for s in steps)  # groups: Triton's kernel
    torch.testing.assert_close(out.view(-1, HEADS, D), want, atol=1e-5, rtol=1e-5)


def test_fa3_refuses_what_it_cannot_express():
    from sgl_ridgefill.attention.fa3 import RidgeFillFa3Backend

    assert RidgeFillFa3Backend.ridgefill_row_queries  # groups go through SGLang's Triton kernel, runs through fa3
    assert RidgeFillFa3Backend.ridgefill_hidden_keys is False  # nofill is refused at admission on fa3
    assert _fa3_backend(_Pool(), 1).ridgefill_visible_keys  # the probe runs at page size 1 ...
    assert not _fa3_backend(_Pool(), 4).ridgefill_visible_keys  # ... and is refused above it
