"""One request's share of an EXTEND forward under RidgeFill: the two-sweep prefill across chunks.

Sweep 1, every chunk: layers ``0..S-1`` exactly for the chunk's rows; the prefix rows' upper layers are
filled from the map; the tail rows' split states are kept; the chunk's rows in a selection's query window add
their share of its attention statistics. Sweep 2, in the chunk that holds the last prompt token: choose the
exact rows, then run layers ``S..L-1`` for the exact rows and the whole tail together, layer by layer over
the filled cache. No tail row reads a row that is about to become exact, whatever the chunk size, because the
upper layers of the tail only ever run after the selection. While other requests decode, sweep 2 may instead
run in slices over the prompt's last chunks, with decode steps between them (``slicing.py``).

The host waits for the device at most once per request, whatever the number of layers, steps, runs and
chunks: to read the selection's inputs (attention statistics, probe, the sink flags of the maps' sink rule)
in one copy, when there are any. The split states of the exact rows come back from host memory ordered on
the device, not by a host wait (``host_rows.py``). (A later request that upgrades cached rows reads the split
states an earlier one kept on the host, and under tensor parallelism agrees with the other ranks on whether
every rank holds them. On hybrid models the terminal-state correction and the Gated DeltaNet state slots still
read device values per layer: ``recurrent.py``.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..attention.staging import to_device
from ..maps.kinds import sink_rows
from . import passes, recurrent, selection, slicing
from .corrections import value_rescaler
from .fill import Fill
from .host_rows import HostRows
from .kv import read_kv, write_kv
from .slicing import SweepTwo
from .upgrade import may_upgrade

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
    (row indices relative to the chunk). None once a sliced sweep has chosen its rows: the held-back tokens'
    queries were captured in the chunk that chose them."""
    from ..selectors.base import AttentionRequirement

    out = []
    if st.sweep is not None:
        return out
    for req in _requirements(st):
        if not isinstance(req, AttentionRequirement):
            continue
        a, b = selection.chunk_query_rows(req, st, p0, n)
        if a >= b:
            continue
        for layer_id in req.layers:
            if layer_id < split:
                out.append((layer_id, a - p0, b - p0, st.queries.setdefault((req, layer_id), [])))
    return out


def begin(st: RequestState, fb: ForwardBatch, i: int, rows: slice, hidden_size: int, dtype: torch.dtype, *,
          chunk_ids: torch.Tensor | None = None, recurrent_sinks: bool = False, sinks: bool = False,
          streams: bool = False) -> None:
    """First chunk of a request: check that the batch runs the prompt the state is bound to, note the
    radix-cache hit, decide whether anything is left to fill, and allocate the second sweep's buffers.

    ``chunk_ids``: ``[n]`` host, the token ids the scheduler put in this chunk (read from the batch, a host
    sync, when not given). ``sinks``: the maps have a sink rule (the ridgefill arm runs sink rows exactly, and
    keeps the split states they are gathered from).
    ``recurrent_sinks``: and the model has upper Gated DeltaNet layers, whose states must then take the
    whole prefix in order in sweep 2, sinks exact among filled rows. ``streams``: nothing the tail attends to
    waits for the last chunk (see :func:`run_chunk`), so each chunk's tail rows run every layer in that chunk."""
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    st.start = p0
    big_n = st.num_tokens
    if st.plan.context and p0 > 0:
        # A kv+context fill needs the split states of the rows before the first one it fills.
        st.run_exact("the radix cache holds part of the prompt, whose split states a kv+context fill needs")
        return
    ids = (chunk_ids if chunk_ids is not None else fb.input_ids[rows].cpu()).long()
    if p0 + n > big_n or not torch.equal(ids, st.prompt_ids[p0 : p0 + n]):
        logger.error("request %s: the batch does not run the prompt it was planned for; running it exactly", fb.rids[i])
        st.run_exact("the scheduler ran another prompt than the one planned")
        return
    if st.boundary <= p0 and not st.plan.reselects:
        st.run_exact("the radix cache already holds the whole prefix")
        return
    if st.logprob_start is not None and p0 + n < big_n:
        # SGLang computes a chunk's prompt logprobs with that chunk, before the tail's upper layers run.
        st.run_exact("prompt logprobs under RidgeFill need the prompt in one chunk")
        return
    device = fb.input_ids.device
    plan = st.plan
    st.streams = streams and st.exact_context <= p0
    if not st.streams:
        st.tail_x = torch.empty((big_n - st.boundary, hidden_size), dtype=dtype, device=device)
    st.states_in_sweep_two = recurrent_sinks
    needs_prefix_x = (plan.has_selection or plan.splice is not None or st.exact_context > p0 or recurrent_sinks
                      or (sinks and plan.arm == "ridgefill"))
    if needs_prefix_x and st.boundary > p0:
        # The new prefix rows' split states wait for the exact rows, known at the last chunk.
        st.prefix_x = HostRows(st.boundary - p0, hidden_size, dtype, device)
    recurrent.begin(st)


def run_chunk(ctx: PassContext, res: SelectionResources, fb: ForwardBatch, i: int, row0: int, st: RequestState,
              hidden: torch.Tensor, *, req_row: int) -> None:
    """Process request ``i`` of ``fb`` (its rows start at ``row0`` in the batch; ``req_row``: its row of
    SGLang's request-to-token table, a host int); write the hidden state of its tail rows into ``hidden``
    when this chunk completes the prompt."""
    ad, plan = ctx.adapter, st.plan
    split, num_layers = plan.split, ad.shape.num_layers
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    big_n, boundary = st.num_tokens, st.boundary
    st.yielded = False  # others may decode before the next chunk (``slicing.py``)
    rows = slice(row0, row0 + n)
    positions, slots = fb.positions[rows], fb.out_cache_loc[rows]

    # Sweep 1: lower layers for every row of the chunk.
    x_split = passes.lower_pass(ctx, fb, i, rows, split, _captures_for(st, p0, n, split))
    if st.queries:
        selection.accumulate_statistics(ctx, st, _requirements(st), ctx.req_to_token[req_row, : p0 + n], p0, n)
    n_prefix = min(max(boundary - p0, 0), n)
    fill = Fill.of_plan(ad, ctx.maps, plan)
    if n_prefix and plan.arm != "nofill":
        # The chunk's prefix rows, in order (no later chunk fills, so the context past them is never read).
        z, st.context = fill.features(x_split[:n_prefix], st.context)
        passes.fill_pass(ctx, fill, x_split[:n_prefix], z, positions[:n_prefix], slots[:n_prefix])
        sink = ctx.maps.folder.sink if fill.maps is not None else None
        if sink:
            # Rows the maps were not fitted on (massive activations) run exactly; read at the last chunk.
            st.sink_flags.append((p0, sink_rows(positions[:n_prefix], x_split[:n_prefix], **sink)))
        if recurrent.fills_states_in_sweep_one(st):  # a model without upper recurrent layers: nothing to fill
            recurrent.fill_states(ctx, fb, i, st, x_split[:n_prefix], p0)
    if n_prefix and st.prefix_x is not None:
        st.prefix_x.write(p0 - st.start, x_split[:n_prefix])
    if st.streams:
        _stream_tail(ctx, fb, i, row0, st, hidden, x_split, n_prefix, req_row=req_row)
        return
    if n_prefix < n:
        st.tail_x[p0 + n_prefix - boundary : p0 + n - boundary] = x_split[n_prefix:]
    req_slots = ctx.req_to_token[req_row, :big_n]
    if st.sweep is not None:  # a sliced sweep (``slicing.py``): one slice per chunk, the rest with the last
        _run_slices(ctx, fb, i, row0, st, hidden, req_slots, everything=p0 + n == big_n)
        return
    if p0 + n < big_n:
        if st.held_back and p0 + n == big_n - st.held_back:
            _hold_back(ctx, res, fb, i, st, req_row)
        return

    # Sweep 2: the selection, then exact rows and tail through the upper layers.
    st.sweep = _choose(ctx, res, fb, i, st, req_slots, sliced=False)
    _run_slices(ctx, fb, i, row0, st, hidden, req_slots, everything=True)


def _hold_back(ctx: PassContext, res: SelectionResources, fb: ForwardBatch, i: int, st: RequestState,
               req_row: int) -> None:
    """The chunk that ends ``st.held_back`` tokens short of the prompt (``slicing.py``): the held-back tokens'
    lower layers run into scratch slots, adding their queries' share of the statistics, then the sweep is chosen
    and cut into slices; their real chunks run the lower layers again into their own slots. Without free slots
    the sweep runs unsliced in the last chunk, whose tokens then capture their queries as usual."""
    big_n, k, split = st.num_tokens, st.held_back, st.plan.split
    scratch = ctx.slicer.scratch(k) if ctx.slicer is not None else None
    if scratch is None:
        st.held_back = 0
        return
    first = big_n - k
    req_slots = ctx.req_to_token[req_row, :big_n]  # a view: the scratch slots written below show in it
    try:
        req_slots[first:] = scratch.to(req_slots.dtype)
        device = fb.input_ids.device
        ids, pos = to_device(device, st.prompt_ids[first:].to(fb.input_ids.dtype),
                             torch.arange(first, big_n, dtype=fb.positions.dtype))
        x = passes.lower_pass_of(ctx, fb, i, first, ids, pos, scratch.to(fb.out_cache_loc.dtype), split,
                                 _captures_for(st, first, k, split))
        if st.queries:
            selection.accumulate_statistics(ctx, st, _requirements(st), req_slots, first, k)
        st.tail_x[first - st.boundary :] = x
    finally:
        ctx.slicer.release(scratch)
    st.sweep = _choose(ctx, res, fb, i, st, req_slots, sliced=True)


def _choose(ctx: PassContext, res: SelectionResources, fb: ForwardBatch, i: int, st: RequestState,
            req_slots: torch.Tensor, *, sliced: bool) -> SweepTwo:
    """The selection, and the second sweep's rows with their split states: in one slice, or (``sliced``) in
    the slices of ``slicing.plan_slices``."""
    plan = st.plan
    big_n, boundary = st.num_tokens, st.boundary
    device = fb.input_ids.device
    if plan.splice is not None:
        splice_prefix(ctx, fb, i, st, req_slots)
    probes = {req: run_probe(ctx, fb, i, st, req.rows, req_slots) for req in _requirements(st) if _is_probe(req)}
    statistics = selection.attention_statistics(st, _requirements(st), device)
    statistics, probes = _read_selection_inputs(st, statistics, probes)
    if ctx.tp is not None:  # each rank summed over its own heads: add the ranks' shares before selecting
        ctx.tp.sum_over_ranks([*statistics.values(), *probes.values()])
    exact = selection.select_rows(st, statistics, probes, tokens=res.tokens, token_counts=res.token_counts)
    if ctx.tp is not None:
        # Every rank runs rank 0's rows: the passes below are collectives. Always exchanged, even when no rank
        # can have selected any, so that no rank-local fact decides whether this collective runs.
        exact, agree = ctx.tp.agree_rows(exact)
        st.stats.update(tp_ranks=ctx.tp.size, tp_rows_agree=agree)
    first_tail = max(boundary, st.start)  # a reused cache may hold the tail's first rows (exact, or the slack)
    tail_pos = torch.arange(first_tail, big_n, dtype=torch.long)
    cached, new = exact[exact < st.start], exact[exact >= st.start]
    upgrade = _cached_rows_to_upgrade(ctx, st, cached)
    x_before = st.tail_x[:0]
    if new.numel():
        x_before = st.prefix_x.gather(new - st.start)
    if upgrade.numel():
        x_before = torch.cat([split_states_from_cache(ctx, fb, i, st, upgrade, req_slots), x_before])
    all_pos = torch.cat([upgrade, new, tail_pos])
    visible = None
    if plan.arm == "nofill":
        shown = torch.zeros(big_n, dtype=torch.bool)
        shown[: st.start] = True
        shown[all_pos] = True
        visible = (shown, to_device(device, shown)[0])
    before_layer = None
    if plan.value_rescale:
        x_rows = torch.cat([x_before, st.tail_x[first_tail - boundary :]])
        before_layer = value_rescaler(ctx, Fill.of_plan(ctx.adapter, ctx.maps, plan), st, new, x_rows, slots=req_slots)
    recurrence = recurrent.sweep_two(ctx, fb, i, st, all_pos)
    if recurrence is None:
        _keep_split_states(ctx, st)
        if ctx.upgrader is None or not ctx.upgrader.rows or not may_upgrade(st):
            st.prefix_x = None  # the exact rows are gathered: the host buffer and its copy back can go
    rows = int(all_pos.numel())
    if sliced:
        held_from = int(torch.searchsorted(all_pos, big_n - st.held_back))
        slices = slicing.plan_slices(rows, held_from, ctx.slicer.rows, st.held_back)
    else:
        slices = [slice(0, rows)]
    return SweepTwo(all_pos, x_before, first_tail, exact, upgrade, new, slices, visible=visible,
                    before_layer=before_layer, recurrence=recurrence)


def _run_slices(ctx: PassContext, fb: ForwardBatch, i: int, row0: int, st: RequestState, hidden: torch.Tensor,
                req_slots: torch.Tensor, *, everything: bool) -> None:
    """Run the sweep's next slice (``everything``: every slice left, and finish the prefill: the chunk holds the
    last prompt token, whose rows get their output in ``hidden``)."""
    sweep, plan = st.sweep, st.plan
    while sweep.slices_left:
        sl = sweep.slices[sweep.done]
        out, shape = passes.upper_pass(
            ctx, fb, i, plan.split, sweep.positions[sl], st.prompt_ids, sweep.rows_of(sl, st.tail_x, st.boundary),
            slots=req_slots, visible=sweep.visible, runs_from=sweep.first_tail, before_layer=sweep.before_layer,
            recurrence=sweep.recurrence,
        )
        sweep.shape = shape if sweep.shape is None else {k: v + shape[k] for k, v in sweep.shape.items()}
        sweep.done += 1
        if not everything:
            return
    # Every tail row of this chunk gets its output (prompt logprobs of the tail; the last row samples).
    p0, n, big_n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i]), st.num_tokens
    first = max(sweep.first_tail, p0)
    hidden[row0 + first - p0 : row0 + n] = out[out.shape[0] - (big_n - first) :]
    _finish(ctx, st, sweep)


def _finish(ctx: PassContext, st: RequestState, sweep: SweepTwo) -> None:
    """The request's prefill is done: its figures, and what later requests may reuse of it."""
    plan = st.plan
    big_n, boundary, split, num_layers = st.num_tokens, st.boundary, plan.split, ctx.adapter.shape.num_layers
    exact, upgrade, new = sweep.exact, sweep.upgrade, sweep.new
    n_new = int(new.numel())
    n_new_prefix = max(boundary - st.start, 0)
    n_filled = n_new_prefix - n_new if plan.arm != "nofill" else 0
    # Against an exact prefill of the rows this request computes: a filled row saves its upper layers, an
    # upgraded row (cached, chosen exact) costs every layer.
    saved = (1 - split / num_layers) * (n_new_prefix - n_new) - int(upgrade.numel())
    shape = sweep.shape
    st.stats.update(
        prompt=big_n, cached=st.start, filled=n_filled,
        exact=int(exact.numel()), sinks=len(st.sink_rows), tail=big_n - boundary,
        virtual_requests=shape["virtual_requests"], groups=shape["groups"], upper_steps=shape["steps"],
        saved_fraction=round(saved / max(big_n - st.start, 1), 4),
    )
    if len(sweep.slices) > 1 or st.held_back:
        st.stats.update(slices=len(sweep.slices))
    if plan.reselects and st.start > 0:
        st.stats.update(upgraded=int(upgrade.numel()), upgraded_stored=st.stats.upgraded_stored or 0)
    if plan.watch_rows is not None:
        if plan.reselects:  # the rows exact once this request ran: its choice and what the cache held exact
            held = st.cached_exact_mask if st.cached_exact_mask is not None else np.zeros(0, dtype=bool)
            now = torch.unique(torch.cat([exact, torch.from_numpy(np.flatnonzero(held)).long()]))
            st.stats.update(**selection.watched_rows(plan.watch_rows, now, 0, boundary))
        else:
            st.stats.update(**selection.watched_rows(plan.watch_rows, exact, st.start, boundary))
    recurrence = sweep.recurrence
    if recurrence is not None and recurrence.rho:
        st.stats.terminal_rho = round(float(torch.cat(list(recurrence.rho.values())).mean()), 4)
    if sweep.visible is not None:
        st.hidden_keys = ~sweep.visible[0][:boundary]
    st.exact_positions = new.tolist()  # host already: the rows row-exact reuse may share as exact
    st.upgraded_positions = upgrade.tolist()
    st.prefill_done = True
    if ctx.upgrader is not None:
        ctx.upgrader.begin(st)  # keeps the split states its decode steps rewrite the rows from
    st.free_buffers()


def _cached_rows_to_upgrade(ctx: PassContext, st: RequestState, cached: torch.Tensor) -> torch.Tensor:
    """Of the cached rows a reselecting request chose, those the cache holds filled (the others are exact
    there already): ``[u]`` int64 host, ascending; agreed over tensor-parallel ranks."""
    if not cached.numel():
        return cached
    mask = st.cached_exact_mask
    known = torch.from_numpy(mask) if mask is not None else torch.zeros(st.start, dtype=torch.bool)
    upgrade = cached[~known[cached]]
    if ctx.tp is not None:  # every rank keeps the same record, but what runs as collectives must agree
        upgrade, _ = ctx.tp.agree_rows(upgrade)
    return upgrade


def _keep_split_states(ctx: PassContext, st: RequestState) -> None:
    """Hand the new prefix rows' split states (``st.prefix_x``, rows ``[start, boundary)``) to the split state
    store, for later requests of a reselecting plan that upgrade these rows once they are cached."""
    if ctx.split_states is None or st.prefix_x is None or not st.plan.reselects or st.plan.cache_mode != "namespace":
        return
    keys = st.row_keys(st.prompt_ids.tolist())
    ctx.split_states.keep(keys[st.start : st.start + len(st.prefix_x)], st.prefix_x)


def split_states_from_cache(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, positions: torch.Tensor,
                            slots: torch.Tensor) -> torch.Tensor:
    """The split states of cached rows (``positions``, ascending, below ``st.start``): those an earlier request
    kept in the split state store, and for the rest layers ``0..S-1`` again, from their embeddings over the
    cached lower-layer KV, which is exact (every prompt row runs the lower layers exactly); such a row rewrites
    its own lower-layer K/V with what it computes, the same values up to the kernels' rounding. Returns
    ``[u, hidden]``. ``slots``: ``[N]`` the request's pool slots. Counts the stored ones in
    ``st.stats.upgraded_stored``."""
    device = fb.input_ids.device
    found = np.zeros(int(positions.numel()), dtype=bool)
    stored = None
    if ctx.split_states is not None:
        keys = st.row_keys(st.prompt_ids.tolist())
        found, stored = ctx.split_states.gather(keys[positions.numpy()], device)
        if ctx.tp is not None and not ctx.tp.all_ranks(bool(found.all())):
            # What runs as collectives must agree: unless every rank holds every row, every rank recomputes all.
            found, stored = np.zeros_like(found), None
    st.stats.upgraded_stored = int(found.sum())
    if found.all():
        return stored
    missing = positions[torch.from_numpy(~found)]
    (ids,) = to_device(device, st.prompt_ids[missing].to(fb.input_ids.dtype))
    x, _ = passes.upper_pass(
        ctx, fb, i, 0, missing, st.prompt_ids, ctx.adapter.embed(ids), slots=slots, runs_from=st.start,
        final_norm=False, stop=st.plan.split,
    )
    if stored is None:
        return x
    out = torch.empty((int(positions.numel()), x.shape[1]), dtype=x.dtype, device=device)
    (where_found, where_missing) = to_device(device, torch.from_numpy(np.flatnonzero(found)),
                                              torch.from_numpy(np.flatnonzero(~found)))
    out[where_found] = stored.to(x.dtype)
    out[where_missing] = x
    return out


def _stream_tail(ctx: PassContext, fb: ForwardBatch, i: int, row0: int, st: RequestState, hidden: torch.Tensor,
                 x_split: torch.Tensor, n_prefix: int, *, req_row: int) -> None:
    """A streaming plan's chunk: its tail rows run the upper layers now, as a stock chunk runs them.

    Exact: a tail row attends to the prefix rows (all before it, filled in this or an earlier chunk, never
    rewritten: no row of such a plan runs exactly in the prefix) and to the tail rows up to itself (this
    chunk's, written by this pass, and earlier chunks', written by theirs), the same keys and values the
    deferred second sweep would give it. No forward then does more than a stock chunk of the same rows: the
    other requests' decode steps wait no longer for it."""
    ad, plan = ctx.adapter, st.plan
    p0, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
    big_n, boundary, split = st.num_tokens, st.boundary, plan.split
    if n_prefix < n:
        tail_pos = torch.arange(p0 + n_prefix, p0 + n, dtype=torch.long)
        out, shape = passes.upper_pass(
            ctx, fb, i, split, tail_pos, st.prompt_ids, x_split[n_prefix:], slots=ctx.req_to_token[req_row, : p0 + n],
            runs_from=int(tail_pos[0]),
        )
        hidden[row0 + n_prefix : row0 + n] = out
        st.stats.add(upper_steps=shape["steps"], virtual_requests=shape["virtual_requests"], groups=shape["groups"])
    if p0 + n < big_n:
        return
    n_new_prefix = max(boundary - st.start, 0)
    st.stats.add(upper_steps=0, virtual_requests=0, groups=0)  # reported as 0 when no chunk had tail rows
    st.stats.update(
        prompt=big_n, cached=st.start, filled=n_new_prefix, exact=0, sinks=0, tail=big_n - boundary,
        saved_fraction=round((1 - split / ad.shape.num_layers) * n_new_prefix / max(big_n - st.start, 1), 4),
        streamed=True,
    )
    st.exact_positions = []
    st.prefill_done = True
    st.free_buffers()


def _read_selection_inputs(st: RequestState, statistics: dict, probes: dict) -> tuple[dict, dict]:
    """The selection's inputs on the host, read from the device in one copy: the attention statistics and the
    probes (``[B]`` each), and the sink flags of every chunk, which become ``st.sink_rows``."""
    parts = [*statistics.values(), *probes.values(), *(flags for _, flags in st.sink_flags)]
    if not parts:
        return statistics, probes
    flat = torch.cat([p.reshape(-1).float() for p in parts]).cpu()  # the request's one read of its selection
    values = iter(flat.split([p.numel() for p in parts]))
    statistics = {key: next(values) for key in statistics}
    probes = {key: next(values) for key in probes}
    for first, _ in st.sink_flags:
        st.sink_rows.extend((torch.nonzero(next(values)).flatten() + first).tolist())
    st.sink_flags = []
    return statistics, probes


def _is_probe(req) -> bool:
    from ..selectors.base import ProbeRequirement

    return isinstance(req, ProbeRequirement)


def splice_prefix(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, slots: torch.Tensor) -> None:
    """Diagnostic for the splice tests (``plan.splice``): the new prefix rows run the exact upper layers
    (writing exact K/V), then every filled row's K/V is rewritten from the fill with exact keys
    (``keys``), exact values (``values``), both (``both``), or the filled keys rescaled to the exact keys'
    per-head norms (``key_norm``), in every upper layer or in the layers ``@first-last`` names (the others
    keep the fill). Costs a full exact prefill of the prefix; normal requests never get here. ``slots``:
    ``[N]`` the request's pool slots."""
    from ..request_schema import parse_splice

    ad, plan = ctx.adapter, st.plan
    kind, layers = parse_splice(plan.splice)
    split, device = plan.split, fb.input_ids.device
    pos = torch.arange(st.start, st.boundary, dtype=torch.long)
    if not pos.numel():
        return
    prefix_x = st.prefix_x.read()
    passes.upper_pass(ctx, fb, i, split, pos, st.prompt_ids, prefix_x, slots=slots, final_norm=False)
    (pos_d,) = to_device(device, pos)
    slots = slots[pos_d]
    fill = Fill.of_plan(ad, ctx.maps, plan)
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


def run_probe(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, rows: int, slots: torch.Tensor) -> torch.Tensor:
    """The probe: the last ``rows`` prompt rows run the exact upper layers over the filled cache,
    before the rest of the tail exists there; returns the attention every prefix row receives from them,
    summed over heads, probe rows and upper layers: ``[B]`` float32 on the device. The probe rows' upper-layer
    K/V are rewritten when the tail runs. ``slots``: ``[N]`` the request's pool slots."""
    ad, plan = ctx.adapter, st.plan
    big_n, boundary, split = st.num_tokens, st.boundary, plan.split
    r = min(rows, big_n - boundary)
    device = fb.input_ids.device
    pos = torch.arange(big_n - r, big_n, dtype=torch.long)
    shown = torch.ones(big_n, dtype=torch.bool)
    shown[boundary : big_n - r] = False  # tail rows whose upper layers have not run yet
    if plan.arm == "nofill":
        shown[st.start : boundary] = False
    key_pos = torch.nonzero(shown).flatten()  # ascending: the prefix keys come first
    in_prefix = int((key_pos < boundary).sum())
    shown_d, key_pos_d, pos_d = to_device(device, shown, key_pos, pos)
    sinks = {layer_id: [] for layer_id in ad.attention_layers if layer_id >= split}
    captures = [(layer_id, 0, r, sink) for layer_id, sink in sinks.items()]
    # Upper recurrent layers (hybrid models): the probe rows start from empty states, as in the paper.
    states = recurrent.upper_recurrent_layers(ctx, split)
    recurrence = recurrent.UpperRecurrence(ctx, fb, i, st, pos, prefix_from_map=False, prefix_len=0) if states else None
    with recurrent.empty_states(ctx, fb, i, states):
        passes.upper_pass(
            ctx, fb, i, split, pos, st.prompt_ids, st.tail_x[-r:], slots=slots, visible=(shown, shown_d),
            captures=captures, final_norm=False, recurrence=recurrence,
        )
    key_slots = slots[key_pos_d]
    total = torch.zeros(boundary, dtype=torch.float32, device=device)
    for layer_id, sink in sinks.items():
        q = torch.cat(sink).reshape(r, -1, ad.shape.head_dim).float()
        k = ctx.pool.get_key_buffer(layer_id)[key_slots].float()
        scale = ad.attention(layer_id).scaling
        received = selection.attention_received(q, k, pos_d, scale, k_pos=key_pos_d)
        total.index_add_(0, key_pos_d[:in_prefix], received[:in_prefix])
    return total
