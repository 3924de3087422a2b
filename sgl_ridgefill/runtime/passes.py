"""The passes one RidgeFill chunk is made of, over sub-batches (``subbatch.py``) of SGLang's batch.

- ``lower_pass``: layers ``0..S-1`` exactly for the chunk's rows of one request; returns ``x_S``.
- ``fill_pass``: for every upper attention layer, K and V from the map's prediction, written into the KV
  pool; no query, attention output or MLP runs (upper recurrent layers of hybrid models: ``recurrent.py``).
- ``upper_pass``: layers ``S..L-1`` exactly for chosen rows of one request (exact rows and the tail, the
  probe rows, or the splice rows) over its cache, layer by layer, so per-layer corrections (value rescale)
  see every row's exact input; or any other range of layers (a cached row a later request chooses exact gets
  its split state back from layers ``0..S-1`` over the cache: ``split=0, stop=S``). Its rows run in steps of
  at most ``PassContext.chunk_rows`` rows (SGLang's chunked-prefill budget): within each layer step after step
  in position order, so every row reads the K/V that earlier steps wrote at that layer and the result is the
  same whatever the chunk size. The steps are planned once (``attention/steps.py``) and each step's attention
  metadata is built once (``ridgefill_prepare``) and reused by every layer of the pass (``ridgefill_activate``).

Nothing here reads a device value on the host: positions, lengths and plans are host values, sent to the
device through ``attention/staging.py``. Every pass gets what it needs in a :class:`PassContext`; nothing
calls back into the runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

from .. import ledger
from ..attention.contract import RowQueries, row_queries, row_query_backend
from ..attention.staging import to_device
from ..attention.steps import GROUP_SIZE, Step, plan_steps
from .kv import write_kv
from .subbatch import virtual_subbatch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .adapter import ModelAdapter
    from .distributed import TensorParallel
    from .fill import Fill
    from .maps_store import MapsStore
    from .slicing import Slicer
    from .split_state_store import SplitStateStore
    from .upgrade import Upgrader

# (layer id, first row, last row + 1, sink): capture the queries of rows [lo, hi) of a pass at a layer.
QueryCapture = tuple[int, int, int, list]
LayerCallback = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class PassContext:
    """What the passes of one forward need.

    ``chunk_rows``: most rows one upper-pass step runs; ``group_size``: rows per group of scattered rows;
    ``tp``: the tensor-parallel group the selection agrees over (``None`` on one device); ``split_states``: the
    split states earlier requests kept for the cached rows a later one upgrades (``None``: recompute them);
    ``slicer``: the scratch slots of a sliced sweep's held-back tokens (``None``: no sweep is sliced);
    ``upgrader``: the exact upgrade a finished prefill may leave to its decode steps (``None``: none).
    """

    adapter: ModelAdapter
    maps: MapsStore | None
    backend: Any
    pool: Any
    req_to_token: torch.Tensor
    physical: bool
    chunk_rows: int
    group_size: int = GROUP_SIZE
    tp: TensorParallel | None = None
    recurrent: Any = None  # hybrid models: recurrent.RecurrentResources
    split_states: SplitStateStore | None = None  # reselecting plans: earlier requests' prefix split states
    slicer: Slicer | None = None  # the second sweep in slices while others decode (``slicing.py``)
    upgrader: Upgrader | None = None  # the exact upgrade in a request's decode steps (``upgrade.py``)


def as_extend(fb: ForwardBatch) -> ForwardBatch:
    """A decode batch as the parent of extend sub-batches (``subbatch.virtual_subbatch`` narrows the rest)."""
    import dataclasses

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return dataclasses.replace(fb, forward_mode=ForwardMode.EXTEND, residual_stream=None)


def plan_batch(backend: Any, fb: ForwardBatch) -> None:
    """SGLang's own attention planning for a (sub-)batch, counted by the census."""
    ledger.count(ledger.METADATA_INITS)
    backend.init_forward_metadata(fb)


def _register_captures(ad: ModelAdapter, captures: Sequence[QueryCapture], offset: list[int]) -> list:
    """Forward pre-hooks on the attention modules that copy the queries of the captured rows; ``offset``
    holds the pass row of the current step's first row."""
    handles = []
    for layer_id, lo, hi, sink in captures:

        def grab(module, args, kwargs, lo=lo, hi=hi, sink=sink):
            q = args[0] if args else kwargs["q"]
            a, b = max(lo - offset[0], 0), min(hi - offset[0], q.shape[0])
            if a < b:
                sink.append(q[a:b].detach().clone())

        handles.append(ad.attention(layer_id).register_forward_pre_hook(grab, with_kwargs=True))
    return handles


def lower_pass(ctx: PassContext, fb: ForwardBatch, i: int, rows: slice, split: int, captures: Sequence[QueryCapture] = ()) -> torch.Tensor:
    """Layers ``0..split-1`` for the batch rows ``rows`` of request ``i`` (its chunk, an ordinary extend
    over its cached prefix); returns ``x_S``: ``[rows, hidden]``."""
    return lower_pass_of(ctx, fb, i, int(fb.extend_prefix_lens_cpu[i]), fb.input_ids[rows], fb.positions[rows],
                         fb.out_cache_loc[rows], split, captures)


def lower_pass_of(ctx: PassContext, fb: ForwardBatch, i: int, first: int, input_ids: torch.Tensor,
                  positions: torch.Tensor, out_cache_loc: torch.Tensor, split: int,
                  captures: Sequence[QueryCapture] = ()) -> torch.Tensor:
    """Layers ``0..split-1`` for consecutive rows of request ``i`` from position ``first`` (an extend over the
    ``first`` rows before them, which the request's row of the request-to-token table maps to their slots):
    ``input_ids``, ``positions``, ``out_cache_loc``: ``[rows]`` on the device. Returns ``x_S``."""
    ad = ctx.adapter
    n = int(input_ids.shape[0])
    sub = virtual_subbatch(
        fb, i, lens=[n], seq_lens=[first + n], input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc,
    )
    handles = _register_captures(ad, captures, [0])
    plan_batch(ctx.backend, sub)
    try:
        hs = ad.embed(sub.input_ids)
        residual_batch.start(sub)
        for layer_id in range(split):
            hs = ad.run_layer(layer_id, sub.positions, hs, sub)
        return residual_batch.fold(hs, sub)
    finally:
        residual_batch.clear(sub)
        for h in handles:
            h.remove()


def fill_pass(ctx: PassContext, fill: Fill, x_split: torch.Tensor, z: torch.Tensor, positions: torch.Tensor,
              slots: torch.Tensor) -> None:
    """Write every upper layer's K/V for filled rows (``fill.py``: the arm's and the maps' kind's).

    ``x_split``: ``[rows, hidden]``; ``z``: their map features; ``positions``, ``slots``: ``[rows]``.
    """
    ad = ctx.adapter
    for layer_id in range(fill.split, ad.shape.num_layers):
        if ad.is_recurrent(layer_id):
            continue  # a Gated DeltaNet layer holds no KV (``recurrent.py`` fills its state)
        k, v = fill.key_value(layer_id, positions, x_split, z)
        write_kv(ctx.pool, ad.attention(layer_id), slots, k, v, physical=ctx.physical)


@dataclass
class _PlannedStep:
    step: Step
    sub: Any  # ForwardBatch of the step's virtual requests
    scope: RowQueries
    prepared: Any  # the backend's metadata of the step


def _planned_steps(
    ctx: PassContext, fb: ForwardBatch, i: int, positions: torch.Tensor, prompt_ids: torch.Tensor,
    slots: torch.Tensor, visible: tuple[torch.Tensor, torch.Tensor] | None, runs_from: int | None,
) -> list[_PlannedStep]:
    """The pass's rows in steps, each with its sub-batch and its attention metadata, built once."""
    device = fb.input_ids.device
    host_visible, device_visible = visible if visible is not None else (None, None)
    out = []
    for step in plan_steps(positions, host_visible, chunk_rows=max(1, ctx.chunk_rows), group_size=ctx.group_size,
                           runs_from=runs_from):
        pos = step.positions
        pos_d, ids_d = to_device(device, pos.to(fb.positions.dtype), prompt_ids[pos].to(fb.input_ids.dtype))
        sub = virtual_subbatch(
            fb, i, lens=step.lens, seq_lens=step.seq_lens, input_ids=ids_d, positions=pos_d,
            out_cache_loc=slots[pos_d].to(fb.out_cache_loc.dtype),
        )
        scope = RowQueries(step, slots, device_visible, host_visible)
        out.append(_PlannedStep(step, sub, scope, row_query_backend(ctx.backend).ridgefill_prepare(scope, sub)))
    return out


def upper_pass(
    ctx: PassContext,
    fb: ForwardBatch,
    i: int,
    split: int,
    positions: torch.Tensor,
    prompt_ids: torch.Tensor,
    x_split: torch.Tensor,
    *,
    slots: torch.Tensor,
    visible: tuple[torch.Tensor, torch.Tensor] | None = None,
    runs_from: int | None = None,
    before_layer: LayerCallback | None = None,
    captures: Sequence[QueryCapture] = (),
    final_norm: bool = True,
    recurrence: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    stop: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """Layers ``split..L-1`` (``split..stop-1`` with ``stop``) for the rows of request ``i`` at ``positions``
    starting from ``x_split``, their input to layer ``split`` (with ``split = 0``: their embeddings).

    ``positions``: ``[rows]`` int64 CPU, ascending; ``prompt_ids``: ``[N]`` int64 CPU (the request's prompt);
    ``x_split``: ``[rows, hidden]``; ``slots``: ``[seq_len]`` pool slots of the request's positions (device);
    ``visible``: ``([seq_len] bool host, the same on the device)``, or ``None``;
    ``runs_from``: the first tail position (rows below it are grouped).
    ``before_layer(layer_id, x_l)`` sees every row's exact layer input (``[rows, hidden]``) before the layer
    runs. ``recurrence(layer_id, x_l)`` runs each recurrent (Gated DeltaNet) layer of a hybrid model for all
    the pass's rows at once (``recurrent.UpperRecurrence``; required when there is one). Returns the
    final-normed hidden states ``[rows, hidden]`` (or the last residual stream) and the pass's shape
    (``steps``, ``virtual_requests``, ``groups``).
    """
    ad = ctx.adapter
    stop = ad.shape.num_layers if stop is None else stop
    steps = _planned_steps(ctx, fb, i, positions, prompt_ids, slots, visible, runs_from)
    shape = {
        "steps": len(steps),
        "virtual_requests": sum(s.step.num_requests for s in steps),
        "groups": sum(s.step.num_groups for s in steps),
    }
    offset = [0]
    handles = _register_captures(ad, captures, offset)
    attention = row_query_backend(ctx.backend)
    try:
        hs = [residual_batch.set_written(x_split[s.step.rows], s.sub) for s in steps]
        for layer_id in range(split, stop):
            recurrent_layer = ad.is_recurrent(layer_id)
            if before_layer is not None or recurrent_layer:
                hs = [residual_batch.fold(h, s.sub) for h, s in zip(hs, steps)]
                x_in = torch.cat(hs)  # every row's layer input
                if before_layer is not None:
                    before_layer(layer_id, x_in)
                if recurrent_layer:
                    # One state per request: the layer runs the pass's rows as one sequence, not step by step.
                    assert recurrence is not None, "a recurrent layer in an upper pass needs its recurrence"
                    x = recurrence(layer_id, x_in)
                    hs = [residual_batch.set_written(x[s.step.rows], s.sub) for s in steps]
                    continue
            for j, s in enumerate(steps):
                offset[0] = s.step.rows.start
                with row_queries(s.scope):
                    attention.ridgefill_activate(s.prepared)
                    hs[j] = ad.run_layer(layer_id, s.sub.positions, hs[j], s.sub)
        if final_norm:
            out = [residual_batch.final_norm(h, s.sub, ad.model.norm) for h, s in zip(hs, steps)]
        else:
            out = [residual_batch.fold(h, s.sub) for h, s in zip(hs, steps)]
        return torch.cat(out), shape
    finally:
        for s in steps:
            residual_batch.clear(s.sub)
        for h in handles:
            h.remove()
