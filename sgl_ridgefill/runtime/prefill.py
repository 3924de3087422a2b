"""One request's share of an EXTEND forward under RidgeFill: the two-sweep prefill across chunks.

Sweep 1, every chunk: layers ``0..S-1`` exactly for the chunk's rows; the prefix rows' upper layers are
filled from the map; the tail rows' split states are kept. Sweep 2, in the chunk that holds the last
prompt token: choose the exact rows, then run layers ``S..L-1`` for the exact rows and the whole tail
together, layer by layer over the filled cache. No tail row reads a row that is about to become exact,
whatever the chunk size, because the upper layers of the tail only ever run after the selection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..maps.kinds import sink_rows
from . import passes, recurrent, selection
from .corrections import value_rescaler
from .fill import Fill
from .kv import read_kv, write_kv

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .passes import PassContext
    from .state import RequestState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionResources:
    """Server-wide inputs of the token selectors: the vocabulary table and calibration token counts."""

    tokens: Any = None
    token_counts: torch.Tensor | None = None


def _requirements(st: RequestState) -> tuple:
    if st.plan.policy is None or st.plan.exact_every is not None or st.plan.exact_rows is not None:
        return ()
    return tuple(st.plan.policy.requirements)


def _captures_for(st: RequestState, p0: int, n: int, split: int) -> list:
    """Lower-layer query captures for the attention requirements whose windows overlap rows ``[p0, p0+n)``
    (row indices relative to the chunk)."""
    from ..selectors.base import AttentionRequirement

    out = []
    for req in _requirements(st):
        if not isinstance(req, AttentionRequirement):
            continue
        lo, hi = selection.query_window(req.query, req.q, st.num_tokens, st.boundary, st.start)
        a, b = max(lo, p0), min(hi, p0 + n)
        if a >= b:
            continue
        for layer_id in req.layers:
            if layer_id < split:
                out.append((layer_id, a - p0, b - p0, st.queries.setdefault((req, layer_id), [])))
    return out


def begin(st: RequestState, fb: ForwardBatch, i: int, rows: slice, hidden_size: int, dtype: torch.dtype, *,
          recurrent_sinks: bool = False) -> None:
    """First chunk of a request: check that the batch runs the prompt the state is bound to, note the
    radix-cache hit, decide whether anything is left to fill, and allocate the second sweep's buffers.

    ``recurrent_sinks``: the fill has sink rows (run exactly) and the model upper Gated DeltaNet layers,
    whose states must then take the whole prefix in order in sweep 2, sinks exact among filled rows."""
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    st.start = p0
    big_n = st.num_tokens
    if st.plan.context and p0 > 0:
        # A kv+context fill needs the split states of the rows before the first one it fills.
        st.run_exact("the radix cache holds part of the prompt, whose split states a kv+context fill needs")
        return
    ids = fb.input_ids[rows].cpu().long()
    if p0 + n > big_n or not torch.equal(ids, st.prompt_ids[p0 : p0 + n]):
        logger.error("request %s: the batch does not run the prompt it was planned for; running it exactly", fb.rids[i])
        st.run_exact("the scheduler ran another prompt than the one planned")
        return
    if st.boundary <= p0:
        st.run_exact("the radix cache already holds the whole prefix")
        return
    if st.logprob_start is not None and p0 + n < big_n:
        # SGLang computes a chunk's prompt logprobs with that chunk, before the tail's upper layers run.
        st.run_exact("prompt logprobs under RidgeFill need the prompt in one chunk")
        return
    device = fb.input_ids.device
    st.tail_x = torch.empty((big_n - st.boundary, hidden_size), dtype=dtype, device=device)
    st.states_in_sweep_two = recurrent_sinks
    if st.plan.has_selection or st.plan.splice is not None or st.exact_context > p0 or recurrent_sinks:
        # The new prefix rows' split states wait for the selection at the last chunk. On a GPU they wait in
        # host memory: they are the size of one layer's activations for the whole prompt, outside SGLang's
        # memory accounting.
        where = "cpu" if device.type == "cuda" else device
        st.prefix_x = torch.empty((st.boundary - p0, hidden_size), dtype=dtype, device=where,
                                  pin_memory=device.type == "cuda")
    recurrent.begin(st)


def run_chunk(ctx: PassContext, res: SelectionResources, fb: ForwardBatch, i: int, row0: int, st: RequestState,
              hidden: torch.Tensor) -> None:
    """Process request ``i`` of ``fb`` (its rows start at ``row0`` in the batch); write the hidden state of
    its tail rows into ``hidden`` when this chunk completes the prompt."""
    ad, plan = ctx.adapter, st.plan
    split, num_layers = plan.split, ad.shape.num_layers
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    big_n, boundary = st.num_tokens, st.boundary
    rows = slice(row0, row0 + n)
    positions, slots = fb.positions[rows], fb.out_cache_loc[rows]

    # Sweep 1: lower layers for every row of the chunk.
    x_split = passes.lower_pass(ctx, fb, i, rows, split, _captures_for(st, p0, n, split))
    n_prefix = min(max(boundary - p0, 0), n)
    fill = Fill(ad, ctx.maps if plan.arm == "ridgefill" else None, split)
    if n_prefix and plan.arm != "nofill":
        # The chunk's prefix rows, in order (no later chunk fills, so the context past them is never read).
        z, st.context = fill.features(x_split[:n_prefix], st.context)
        passes.fill_pass(ctx, fill, x_split[:n_prefix], z, positions[:n_prefix], slots[:n_prefix])
        sink = ctx.maps.folder.sink if fill.maps is not None else None
        if sink:
            # Rows the maps were not fitted on (massive activations) run exactly.
            flagged = sink_rows(positions[:n_prefix], x_split[:n_prefix], **sink)
            st.sink_rows.extend(positions[:n_prefix][flagged].tolist())
            if st.prefix_x is None:  # no selection: the sinks are the only exact prefix rows
                st.sink_x.append(x_split[:n_prefix][flagged.to(x_split.device)])
        if recurrent.fills_states_in_sweep_one(st):  # a model without upper recurrent layers: nothing to fill
            recurrent.fill_states(ctx, fb, i, st, x_split[:n_prefix], p0)
    if n_prefix and st.prefix_x is not None:
        st.prefix_x[p0 - st.start : p0 - st.start + n_prefix].copy_(x_split[:n_prefix], non_blocking=True)
    if n_prefix < n:
        st.tail_x[p0 + n_prefix - boundary : p0 + n - boundary] = x_split[n_prefix:]
    if p0 + n < big_n:
        return

    # Sweep 2: the selection, then exact rows and tail through the upper layers.
    device = fb.input_ids.device
    req_slots = ctx.req_to_token[fb.req_pool_indices[i], :big_n]
    if plan.splice is not None:
        splice_prefix(ctx, fb, i, st)
    probes = {req: run_probe(ctx, fb, i, st, req.rows) for req in _requirements(st) if _is_probe(req)}
    statistics = selection.attention_statistics(ctx, st, _requirements(st), req_slots)
    if ctx.tp is not None:  # each rank summed over its own heads: add the ranks' shares before selecting
        ctx.tp.sum_over_ranks([*statistics.values(), *probes.values()])
    exact = selection.select_rows(st, statistics, probes, tokens=res.tokens, token_counts=res.token_counts)
    if ctx.tp is not None:
        # Every rank runs rank 0's rows: the passes below are collectives. Always exchanged, even when no rank
        # can have selected any, so that no rank-local fact decides whether this collective runs.
        exact, agree = ctx.tp.agree_rows(exact)
        st.stats.update(tp_ranks=ctx.tp.size, tp_rows_agree=agree)
    n_sinks = len(st.sink_rows)
    tail_pos = torch.arange(boundary, big_n, dtype=torch.long)
    all_pos = torch.cat([exact, tail_pos])
    x_rows = st.tail_x
    if exact.numel():
        # Without a selection the exact rows are the sinks, in position order as they were kept.
        x_exact = st.prefix_x[exact - st.start] if st.prefix_x is not None else torch.cat(st.sink_x)
        x_rows = torch.cat([x_exact.to(device, non_blocking=True), st.tail_x])
    visible = None
    if plan.arm == "nofill":
        visible = torch.zeros(big_n, dtype=torch.bool, device=device)
        visible[: st.start] = True
        visible[all_pos.to(device)] = True
    before_layer = None
    if plan.value_rescale:
        before_layer = value_rescaler(ctx, fill, st, exact, x_rows, slots=req_slots)
    recurrence = recurrent.sweep_two(ctx, fb, i, st, all_pos)
    out, shape = passes.upper_pass(
        ctx, fb, i, split, all_pos, st.prompt_ids, x_rows, seq_len=big_n, visible=visible, runs_from=boundary,
        before_layer=before_layer, recurrence=recurrence,
    )
    # Every tail row of this chunk gets its output (prompt logprobs of the tail; the last row samples).
    first = max(boundary, p0)
    hidden[row0 + first - p0 : row0 + n] = out[int(exact.numel()) + first - boundary :]
    n_exact = int(exact.numel())
    n_new_prefix = max(boundary - st.start, 0)
    st.stats.update(
        prompt=big_n, cached=st.start, filled=n_new_prefix - n_exact if plan.arm != "nofill" else 0,
        exact=n_exact, sinks=n_sinks, tail=big_n - boundary, virtual_requests=shape["virtual_requests"],
        groups=shape["groups"],
        upper_steps=shape["steps"],
        saved_fraction=round((1 - split / num_layers) * (n_new_prefix - n_exact) / max(big_n - st.start, 1), 4),
    )
    if plan.watch_rows is not None:
        st.stats.update(selection.watched_rows(plan.watch_rows, exact, st.start, boundary))
    if recurrence is not None and recurrence.rho:
        st.stats["terminal_rho"] = round(float(torch.cat(list(recurrence.rho.values())).mean()), 4)
    if plan.arm == "nofill":
        st.hidden_keys = ~visible[:boundary].cpu()
    st.prefill_done = True
    st.free_buffers()


def _is_probe(req) -> bool:
    from ..selectors.base import ProbeRequirement

    return isinstance(req, ProbeRequirement)


def splice_prefix(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState) -> None:
    """Diagnostic for the splice tests (``plan.splice``): the new prefix rows run the exact upper layers
    (writing exact K/V), then every filled row's K/V is rewritten from the fill with exact keys
    (``keys``), exact values (``values``), both (``both``), or the filled keys rescaled to the exact keys'
    per-head norms (``key_norm``), in every upper layer or in the layers ``@first-last`` names (the others
    keep the fill). Costs a full exact prefill of the prefix; normal requests never get here."""
    from ..request_schema import parse_splice

    ad, plan = ctx.adapter, st.plan
    kind, layers = parse_splice(plan.splice)
    split, device = plan.split, fb.input_ids.device
    pos = torch.arange(st.start, st.boundary, dtype=torch.long)
    if not pos.numel():
        return
    prefix_x = st.prefix_x.to(device)
    passes.upper_pass(ctx, fb, i, split, pos, st.prompt_ids, prefix_x, seq_len=st.num_tokens, final_norm=False)
    pos_d = pos.to(device)
    slots = ctx.req_to_token[fb.req_pool_indices[i], pos_d]
    fill = Fill(ad, ctx.maps if plan.arm == "ridgefill" else None, split)
    z, _ = fill.features(prefix_x)  # from the start of the prompt: a kv+context plan never starts later
    for layer_id in ad.attention_layers:
        if layer_id < split:
            continue
        k, v = fill.key_value(layer_id, pos_d.to(fb.positions.dtype), prefix_x, z)
        k_exact, v_exact = read_kv(ctx.pool, layer_id, slots)
        k_exact, v_exact = k_exact.to(k.dtype), v_exact.to(v.dtype)
        spliced = layers is None or layers[0] <= layer_id <= layers[1]
        if spliced and kind in ("keys", "both"):
            k = k_exact
        if spliced and kind in ("values", "both"):
            v = v_exact
        if spliced and kind == "key_norm":
            scale = k_exact.float().norm(dim=-1, keepdim=True) / k.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
            k = k * scale.to(k.dtype)
        write_kv(ctx.pool, ad.attention(layer_id), slots, k, v, physical=ctx.physical)


def run_probe(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, rows: int) -> torch.Tensor:
    """The probe (SPEC.md): the last ``rows`` prompt rows run the exact upper layers over the filled cache,
    before the rest of the tail exists there; returns the attention every prefix row receives from them,
    summed over heads, probe rows and upper layers: ``[B]`` float32. The probe rows' upper-layer K/V are
    rewritten when the tail runs."""
    ad, plan = ctx.adapter, st.plan
    big_n, boundary, split = st.num_tokens, st.boundary, plan.split
    r = min(rows, big_n - boundary)
    device = fb.input_ids.device
    pos = torch.arange(big_n - r, big_n, dtype=torch.long)
    visible = torch.ones(big_n, dtype=torch.bool, device=device)
    visible[boundary : big_n - r] = False  # tail rows whose upper layers have not run yet
    if plan.arm == "nofill":
        visible[st.start : boundary] = False
    sinks = {layer_id: [] for layer_id in ad.attention_layers if layer_id >= split}
    captures = [(layer_id, 0, r, sink) for layer_id, sink in sinks.items()]
    # Upper recurrent layers (hybrid models): the probe rows start from empty states, as in the paper.
    states = recurrent.upper_recurrent_layers(ctx, split)
    recurrence = recurrent.UpperRecurrence(ctx, fb, i, st, pos, prefix_from_map=False, prefix_len=0) if states else None
    with recurrent.empty_states(ctx, fb, i, states):
        passes.upper_pass(
            ctx, fb, i, split, pos, st.prompt_ids, st.tail_x[-r:], seq_len=big_n, visible=visible,
            captures=captures, final_norm=False, recurrence=recurrence,
        )
    key_pos = torch.nonzero(visible).flatten()
    slots_all = ctx.req_to_token[fb.req_pool_indices[i], :big_n]
    total = torch.zeros(boundary, dtype=torch.float32)
    in_prefix = key_pos < boundary
    pos_d = pos.to(device)
    for layer_id, sink in sinks.items():
        q = torch.cat(sink).reshape(r, -1, ad.shape.head_dim).float()
        k = ctx.pool.get_key_buffer(layer_id)[slots_all[key_pos]].float()
        scale = ad.attention(layer_id).scaling
        received = selection.attention_received(q, k, pos_d, scale, k_pos=key_pos)
        total[key_pos[in_prefix].cpu()] += received[in_prefix].cpu()
    return total
