"""One request's share of an EXTEND forward under RidgeFill: the two-sweep prefill across chunks.

Sweep 1, every chunk: layers ``0..S-1`` exactly for the chunk's rows; the prefix rows' upper layers are
filled from the map; the tail rows' split states are kept. Sweep 2, in the chunk that holds the last
prompt token: choose the exact rows, then run layers ``S..L-1`` for the exact rows and the whole tail
together, layer by layer over the filled cache. No tail row reads a row that is about to become exact,
whatever the chunk size, because the upper layers of the tail only ever run after the selection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from . import attention_scope, passes, selection
from .subbatch import rows_subbatch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .plan import RequestState
    from .runtime import RidgeFillRuntime

logger = logging.getLogger(__name__)


def _captures_for(rt: RidgeFillRuntime, st: RequestState, p0: int, n: int, split: int, upper: bool) -> list:
    """Query captures for the statistics requirements whose windows overlap rows ``[p0, p0+n)``."""
    from ..selectors.base import AttentionRequirement

    out = []
    for req in rt.requirements(st.plan):
        if not isinstance(req, AttentionRequirement):
            continue
        lo, hi = selection.query_window(req.query, req.q, st.num_tokens, st.boundary)
        a, b = max(lo, p0), min(hi, p0 + n)
        if a >= b:
            continue
        for layer_id in req.layers:
            if (layer_id >= split) == upper:
                sink = st.queries.setdefault((req, layer_id), [])
                out.append((layer_id, a - p0, b - p0, sink))
    return out


def run_chunk(rt: RidgeFillRuntime, fb: ForwardBatch, i: int, row0: int, st: RequestState, hidden: torch.Tensor) -> None:
    """Process request ``i`` of ``fb`` (its rows start at ``row0`` in the batch); write the hidden state of
    its last row into ``hidden`` when this chunk completes the prompt."""
    ad, plan = rt.adapter, st.plan
    split, num_layers = plan.split, ad.shape.num_layers
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    big_n, boundary = st.num_tokens, st.boundary
    rows = slice(row0, row0 + n)
    positions, slots = fb.positions[rows], fb.out_cache_loc[rows]

    # Sweep 1: lower layers for every row of the chunk.
    sub = rows_subbatch(fb, i, input_ids=fb.input_ids[rows], positions=positions, out_cache_loc=slots, seq_len=p0 + n)
    x_split = passes.lower_pass(ad, sub, split, _captures_for(rt, st, p0, n, split, upper=False))

    n_prefix = min(max(boundary - p0, 0), n)
    if n_prefix and plan.arm != "nofill":
        maps = rt.maps if plan.arm == "ridgefill" else None
        passes.fill_pass(
            ad, maps, split, x_split[:n_prefix], positions[:n_prefix], slots[:n_prefix],
            physical=fb.out_cache_loc_is_physical,
        )
    if n_prefix and st.prefix_x is not None:
        st.prefix_x[p0 - st.start : p0 - st.start + n_prefix] = x_split[:n_prefix]
    if n_prefix < n:
        st.tail_x[p0 + n_prefix - boundary : p0 + n - boundary] = x_split[n_prefix:]

    if p0 + n < big_n:
        return
    # Sweep 2: the selection, then exact rows and tail through the upper layers.
    req_row = fb.req_pool_indices[i]
    req_to_token = rt.req_to_token()
    device = fb.input_ids.device
    from ..selectors.base import ProbeRequirement

    if plan.splice is not None:
        splice_prefix(rt, fb, i, st)
    probes = {
        req: run_probe(rt, fb, i, st, req.rows) for req in rt.requirements(plan) if isinstance(req, ProbeRequirement)
    }
    exact = rt.select_rows(fb, i, st, probes)
    tail_pos = torch.arange(boundary, big_n, dtype=torch.long)
    all_pos = torch.cat([exact, tail_pos])
    all_pos_d = all_pos.to(device)
    x_rows = torch.cat([st.prefix_x[exact - st.start], st.tail_x]) if exact.numel() else st.tail_x
    upper_sub = rows_subbatch(
        fb, i,
        input_ids=st.prompt_ids[all_pos].to(device),
        positions=all_pos_d.to(fb.positions.dtype),
        out_cache_loc=req_to_token[req_row, all_pos_d].to(fb.out_cache_loc.dtype),
        seq_len=big_n,
    )
    visible = None
    if plan.arm == "nofill":
        visible = torch.zeros(big_n, dtype=torch.bool, device=device)
        visible[: st.start] = True
        visible[all_pos_d] = True
    before_layer = None
    if plan.value_rescale:
        before_layer = rt.value_rescaler(st, exact, x_rows, n_exact=int(exact.numel()), req_row=req_row)
    out = passes.upper_pass(ad, upper_sub, split, x_rows, visible_keys=visible, before_layer=before_layer)
    # Every tail row of this chunk gets its output (prompt logprobs of the tail; the last row samples).
    first = max(boundary, p0)
    hidden[row0 + first - p0 : row0 + n] = out[int(exact.numel()) + first - boundary :]
    n_new_prefix = max(boundary - st.start, 0)
    st.stats.update(
        prompt=big_n, cached=st.start, filled=n_new_prefix - int(exact.numel()) if plan.arm != "nofill" else 0,
        exact=int(exact.numel()), tail=big_n - boundary,
        saved_fraction=(1 - split / num_layers) * (n_new_prefix - int(exact.numel())) / max(big_n - st.start, 1),
    )
    if plan.arm == "nofill":
        hidden_keys = ~visible[:boundary].cpu()
        attention_scope.hide_rows(fb.rids[i], split, hidden_keys)
    st.prefill_done = True
    st.tail_x = st.prefix_x = None
    st.queries.clear()


def splice_prefix(rt: RidgeFillRuntime, fb: ForwardBatch, i: int, st: RequestState) -> None:
    """Diagnostic for the splice tests (``plan.splice``): the new prefix rows run the exact upper layers
    (writing exact K/V), then every filled row's K/V is rewritten from the fill with exact keys
    (``keys``), exact values (``values``), both (``both``), or the filled keys rescaled to the exact keys'
    per-head norms (``key_norm``). Costs a full exact prefill of the prefix; normal requests never get here."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    ad, plan = rt.adapter, st.plan
    split, device = plan.split, fb.input_ids.device
    pos = torch.arange(st.start, st.boundary, dtype=torch.long)
    if not pos.numel():
        return
    pos_d = pos.to(device)
    slots = rt.req_to_token()[fb.req_pool_indices[i], pos_d].to(fb.out_cache_loc.dtype)
    sub = rows_subbatch(
        fb, i, input_ids=st.prompt_ids[pos].to(device), positions=pos_d.to(fb.positions.dtype),
        out_cache_loc=slots, seq_len=st.num_tokens,
    )
    passes.upper_pass(ad, sub, split, st.prefix_x, final_norm=False)
    pool = rt.attn_backend().token_to_kv_pool
    loc = KVWriteLoc(slots, None, physical=fb.out_cache_loc_is_physical)
    maps = rt.maps if plan.arm == "ridgefill" else None
    for layer_id in range(split, ad.shape.num_layers):
        x_hat = st.prefix_x if maps is None else maps.predict(split, layer_id, st.prefix_x)
        k, v = ad.key_value(layer_id, pos_d.to(fb.positions.dtype), x_hat)
        k_exact = pool.get_key_buffer(layer_id)[slots].to(k.dtype)
        v_exact = pool.get_value_buffer(layer_id)[slots].to(v.dtype)
        if plan.splice in ("keys", "both"):
            k = k_exact
        if plan.splice in ("values", "both"):
            v = v_exact
        if plan.splice == "key_norm":
            scale = k_exact.float().norm(dim=-1, keepdim=True) / k.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
            k = k * scale.to(k.dtype)
        pool.set_kv_buffer(ad.layers[layer_id].self_attn.attn, loc, k.contiguous(), v.contiguous())


def run_probe(rt: RidgeFillRuntime, fb: ForwardBatch, i: int, st: RequestState, rows: int) -> torch.Tensor:
    """The probe (SPEC.md): the last ``rows`` prompt rows run the exact upper layers over the filled cache,
    before the rest of the tail exists there; returns the attention every prefix row receives from them,
    summed over heads, probe rows and upper layers: ``[B]`` float32. The probe rows' upper-layer K/V are
    rewritten when the tail runs."""
    ad, plan = rt.adapter, st.plan
    big_n, boundary, split = st.num_tokens, st.boundary, plan.split
    r = min(rows, big_n - boundary)
    device = fb.input_ids.device
    pos = torch.arange(big_n - r, big_n, dtype=torch.long)
    visible = torch.ones(big_n, dtype=torch.bool, device=device)
    visible[boundary : big_n - r] = False  # tail rows whose upper layers have not run yet
    if plan.arm == "nofill":
        visible[st.start : boundary] = False
    pos_d = pos.to(device)
    slots_all = rt.req_to_token()[fb.req_pool_indices[i], :big_n]
    sub = rows_subbatch(
        fb, i, input_ids=st.prompt_ids[pos].to(device), positions=pos_d.to(fb.positions.dtype),
        out_cache_loc=slots_all[pos_d].to(fb.out_cache_loc.dtype), seq_len=big_n,
    )
    sinks = {layer_id: [] for layer_id in range(split, ad.shape.num_layers)}
    captures = [(layer_id, 0, r, sink) for layer_id, sink in sinks.items()]
    passes.upper_pass(ad, sub, split, st.tail_x[-r:], visible_keys=visible, captures=captures, final_norm=False)
    key_pos = torch.nonzero(visible).flatten()
    pool = rt.attn_backend().token_to_kv_pool
    total = torch.zeros(boundary, dtype=torch.float32)
    in_prefix = key_pos < boundary
    for layer_id, sink in sinks.items():
        q = torch.cat(sink).reshape(r, -1, ad.shape.head_dim).float()
        k = pool.get_key_buffer(layer_id)[slots_all[key_pos]].float()
        scale = ad.layers[layer_id].self_attn.attn.scaling
        received = selection.attention_received(q, k, pos_d, scale, k_pos=key_pos)
        total[key_pos[in_prefix].cpu()] += received[in_prefix].cpu()
    return total
