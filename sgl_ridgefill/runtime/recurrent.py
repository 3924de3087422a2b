"""The upper Gated DeltaNet (GDN) layers of a hybrid model under RidgeFill: one recurrent state per layer and
request, advanced in position order.

The method has no separate fill for GDN layers: the map predicts every upper layer's *input*, and a
filled row runs the GDN layer's own norm, input projections, short conv and gated delta-rule update on
``x̂_l``, so its error folds into the state the tail inherits; its ``z`` projection, output norm, output
projection and MLP are skipped (on the CPU the stand-in delta rule does not even compute the outputs of
filled rows: :func:`sgl_ridgefill.gdn_ops.outputs_unread`). The state lives in the request's slot of
SGLang's ``MambaPool`` and SGLang's own linear-attention backend advances it (a contiguous extend sub-batch
of the request); chunked prefill carries it from chunk to chunk as it does for stock requests.

Two orders, both "the whole prefix through the state in position order once":

- **no exact rows** (no selection): every chunk's new prefix rows update the state right after the fill
  (:func:`fill_states`); at the prompt's last chunk the tail continues from it (:class:`UpperRecurrence`,
  ``prefix_from_map=False``).
- **exact rows** (a selection, known only at the last chunk): the upper states stay at the radix-cache hit
  through sweep 1; in sweep 2, layer by layer, the rows ``[start, N)`` pass through the state in order,
  filled rows with ``x̂_l`` (from the kept split states) and exact rows and the tail with their exact
  inputs (``prefix_from_map=True``); only exact rows and the tail get an output.

Arms: ``exact`` (nothing of this runs), ``ridgefill`` (``x̂_l`` from the map), ``identity`` (``x̂_l = x_S``),
``nofill``: the prefix's filled rows never enter the upper states, which see only the exact rows and the
tail, as one sequence in position order from the state at ``start`` (conv window included), mirroring the
attention layers, where the tail attends only to exact rows. The probe (a selector) starts from empty states
(:func:`empty_states`), as in the paper.

Terminal-state correction (a policy's ``correct terminal_state(...)``): once, after the last prefix row and
before the first tail row enters layer ``l``, ``ρ_{l,h} · ΔM_l[h]`` is added to the state. ``ΔM_l``
(``[HV, V, K]``, SGLang's state layout) is the mean exact-minus-filled state measured by ``sgl-ridgefill
calibrate terminal-state``; ``ρ_{l,h}`` is the share of the state's row weight held by filled rows, where row
``t`` weighs ``Π_{s>t} α_s`` (``α = e^g``, the gates this request computes for its prefix rows):

    ρ_new = Σ_{t filled} e^{-G_t} / Σ_{start <= t < B} e^{-G_t},  G_t = Σ_{start <= s <= t} g_s  (log-sum-exp)
    ρ     = ρ_new · (1 - e^{G_{B-1}})  when rows [0, start) came from the radix cache

The cached rows' gates are never computed by this request; ``e^{G_{B-1}}`` is the decay the new rows apply
to the cached state, and with constant gates over a long history ``1 - e^{G_{B-1}}`` is exactly the new
rows' share (an approximation of the paper's definition, which has no radix cache).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..attention.staging import to_device
from .. import gdn_ops
from .subbatch import virtual_subbatch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .passes import PassContext
    from .state import RequestState

TERMINAL_FILE = "terminal_state.safetensors"


@dataclass(frozen=True)
class RecurrentResources:
    """Server-wide inputs of the upper GDN layers: per offsets file (as a policy names it) and per ``(split,
    arm)`` it was measured for, ``ΔM_l`` of every upper GDN layer, ``[HV, V, K]`` float32 on the model's
    device (``maps/terminal.py``)."""

    offsets: Mapping[str, Mapping[tuple[int, str], Mapping[int, torch.Tensor]]] = field(default_factory=dict)


@dataclass
class GateSums:
    """One request's running gate sums over its new prefix rows, per upper GDN layer (float64, ``[HV]``).

    ``cum``: ``G`` through the last row added; ``lse_all`` / ``lse_filled``: log-sum-exp of ``-G_t`` over all
    rows and over the filled rows added so far."""

    cum: dict[int, torch.Tensor] = field(default_factory=dict)
    lse_all: dict[int, torch.Tensor] = field(default_factory=dict)
    lse_filled: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, layer_id: int, g: torch.Tensor, filled: torch.Tensor) -> None:
        """Rows in position order: ``g`` ``[rows, HV]`` log decays, ``filled`` ``[rows]`` bool."""
        if not g.shape[0]:
            return
        g = g.detach().to("cpu", torch.float64)
        heads = g.shape[1]
        neg_inf = torch.full((heads,), float("-inf"), dtype=torch.float64)
        cum = self.cum.get(layer_id, torch.zeros(heads, dtype=torch.float64)) + g.cumsum(0)  # G_t [rows, HV]
        self.cum[layer_id] = cum[-1]
        lse_all = torch.logsumexp(-cum, dim=0)
        self.lse_all[layer_id] = torch.logaddexp(self.lse_all.get(layer_id, neg_inf), lse_all)
        mask = filled.to("cpu", torch.bool)
        lse_f = torch.logsumexp(-cum[mask], dim=0) if bool(mask.any()) else neg_inf
        self.lse_filled[layer_id] = torch.logaddexp(self.lse_filled.get(layer_id, neg_inf), lse_f)

    def rho(self, layer_id: int, *, cached: bool) -> torch.Tensor:
        """``ρ_l`` per value head, ``[HV]`` float32 (zeros when no row was added)."""
        if layer_id not in self.cum:
            return torch.zeros(0)
        share = torch.exp(self.lse_filled[layer_id] - self.lse_all[layer_id])
        if cached:
            share = share * (1.0 - torch.exp(self.cum[layer_id]))
        return share.float()


def upper_recurrent_layers(ctx: PassContext, split: int) -> list[int]:
    ad = ctx.adapter
    return [l for l in range(split, ad.shape.num_layers) if ad.is_recurrent(l)]


def has_recurrent_layers(ctx: PassContext, split: int) -> bool:
    return bool(upper_recurrent_layers(ctx, split))


def _linear_backend(ctx: PassContext):
    return getattr(ctx.backend, "linear_attn_backend", ctx.backend)


def _sequence_subbatch(fb: ForwardBatch, i: int, rows: int, prefix_len: int):
    """Request ``i``'s ``rows`` next rows of a GDN sequence whose state already holds ``prefix_len`` rows, as
    an extend sub-batch (the GDN backend reads only the request's slot, the row count and whether the state
    is empty: ``prefix_len > 0``)."""
    device = fb.input_ids.device
    positions = torch.arange(prefix_len, prefix_len + rows, device=device, dtype=fb.positions.dtype)
    return virtual_subbatch(
        fb, i, lens=[rows], seq_lens=[prefix_len + rows], input_ids=fb.input_ids.new_zeros(rows),
        positions=positions, out_cache_loc=fb.out_cache_loc.new_zeros(rows),
    )


def run_sequence(ctx: PassContext, fb: ForwardBatch, i: int, layer_id: int, mixed_qkv: torch.Tensor,
                 a: torch.Tensor, b: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Advance request ``i``'s state of GDN layer ``layer_id`` over rows in order (conv window and recurrent
    state, in its pool slot), in steps of at most ``ctx.chunk_rows`` rows; returns the recurrence's output
    ``[rows, HV, V]``. ``mixed_qkv``: ``[rows, conv_dim]``; ``a``, ``b``: ``[rows, HV]``."""
    mixer = ctx.adapter.layers[layer_id].linear_attn
    linear = _linear_backend(ctx)
    n = mixed_qkv.shape[0]
    step = max(1, ctx.chunk_rows)
    outs = []
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        sub = _sequence_subbatch(fb, i, hi - lo, prefix_len + lo)
        linear.init_forward_metadata(sub)
        core = mixer.attn(sub, mixed_qkv=mixed_qkv[lo:hi].contiguous(), a=a[lo:hi].contiguous(), b=b[lo:hi].contiguous())
        outs.append(core.reshape(hi - lo, mixer.num_v_heads, mixer.head_v_dim))
    if not outs:
        return mixed_qkv.new_zeros((0, mixer.num_v_heads, mixer.head_v_dim))
    return torch.cat(outs)


def _slot(ctx: PassContext, fb: ForwardBatch, i: int) -> int:
    """Request ``i``'s slot in SGLang's ``MambaPool`` (what its GDN layers read and write)."""
    pool = ctx.backend.req_to_token_pool
    return int(pool.get_mamba_indices(fb.req_pool_indices[i : i + 1])[0])


def _layer_cache(ctx: PassContext, layer_id: int):
    return ctx.backend.req_to_token_pool.mamba2_layer_cache(layer_id)


def read_state(ctx: PassContext, fb: ForwardBatch, i: int, layer_id: int) -> torch.Tensor:
    """Request ``i``'s recurrent state of GDN layer ``layer_id``: a copy, ``[HV, V, K]``."""
    return _layer_cache(ctx, layer_id).temporal[_slot(ctx, fb, i)].clone()


def add_to_state(ctx: PassContext, fb: ForwardBatch, i: int, layer_id: int, delta: torch.Tensor) -> None:
    """``state += delta`` for request ``i`` in GDN layer ``layer_id`` (``delta``: ``[HV, V, K]``)."""
    temporal = _layer_cache(ctx, layer_id).temporal
    slot = _slot(ctx, fb, i)
    temporal[slot] = (temporal[slot].float() + delta.float()).to(temporal.dtype)


def _snapshot(ctx: PassContext, slot: int, layers: list[int]) -> list:
    """Copies of the states (conv window and recurrent state) of ``layers`` in the pool slot ``slot``."""
    out = []
    for l in layers:
        cache = _layer_cache(ctx, l)
        out.append((cache, [c[slot].clone() for c in cache.conv], cache.temporal[slot].clone()))
    return out


def _restore(slot: int, saved: list) -> None:
    for cache, conv, temporal in saved:
        for c, value in zip(cache.conv, conv):
            c[slot] = value
        cache.temporal[slot] = temporal


@contextlib.contextmanager
def empty_states(ctx: PassContext, fb: ForwardBatch, i: int, layers: list[int]) -> Iterator[None]:
    """Request ``i``'s states of ``layers`` (conv window and recurrent state) are zero inside the block and
    restored after it: the probe starts from empty states, as in the paper. No layers (a dense model, which
    has no state pool): nothing to do."""
    if not layers:
        yield
        return
    slot = _slot(ctx, fb, i)
    saved = _snapshot(ctx, slot, layers)
    for cache, _, _ in saved:
        for c in cache.conv:
            c[slot] = 0
        cache.temporal[slot] = 0
    try:
        yield
    finally:
        _restore(slot, saved)


@contextlib.contextmanager
def restored_on_failure(ctx: PassContext, fb: ForwardBatch, i: int) -> Iterator[None]:
    """Request ``i``'s states of every recurrent layer are put back as they were if the block raises: the
    exact fallback then runs the chunk from the states it started from, not from states RidgeFill's lower
    pass (or fill) already advanced over the same rows. Nothing to do on a dense model."""
    layers = list(ctx.adapter.recurrent_layers)
    if not layers:
        yield
        return
    slot = _slot(ctx, fb, i)
    saved = _snapshot(ctx, slot, layers)
    try:
        yield
    except BaseException:
        _restore(slot, saved)
        raise


def fills_states_in_sweep_one(st: RequestState) -> bool:
    """Whether the upper states take the new prefix rows chunk by chunk (no exact rows can come: no
    selection, a filling arm); otherwise they take the whole prefix in sweep 2."""
    plan = st.plan
    return plan.arm != "nofill" and not plan.has_selection and plan.splice is None and not st.states_in_sweep_two


def _predict(ctx: PassContext, st: RequestState, layer_id: int, x_split: torch.Tensor) -> torch.Tensor:
    if st.plan.arm == "identity" or ctx.maps is None:
        return x_split
    return ctx.maps.predict(st.plan.split, layer_id, x_split)


def fill_states(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, x_split: torch.Tensor, p0: int) -> None:
    """Sweep 1 without exact rows: the chunk's new prefix rows ``[p0, p0 + rows)`` (split states ``x_split``,
    ``[rows, d]``) enter every upper GDN layer's state, with ``x̂_l`` as input; nothing else of the layer runs."""
    ad = ctx.adapter
    filled = torch.ones(x_split.shape[0], dtype=torch.bool)
    for layer_id in upper_recurrent_layers(ctx, st.plan.split):
        _, mixed_qkv, a, b = ad.gdn_inputs(layer_id, _predict(ctx, st, layer_id, x_split))
        with gdn_ops.outputs_unread():  # filled rows' outputs are never read: the CPU stand-in skips them
            run_sequence(ctx, fb, i, layer_id, mixed_qkv, a, b, prefix_len=p0)
        if st.recurrent is not None:
            st.recurrent.add(layer_id, ad.gdn_gates(layer_id, a), filled)


def begin(st: RequestState) -> None:
    """First chunk of a request: gate sums for its terminal-state correction, if it has one."""
    st.recurrent = GateSums() if st.plan.terminal_state is not None else None


class UpperRecurrence:
    """How ``passes.upper_pass`` runs an upper GDN layer for request ``i``: ``(layer_id, x)`` -> the layer's
    output for the pass's rows (``x``: their layer inputs ``[rows, d]``, rows at ``positions``, ascending).

    ``prefix_from_map=False``: the pass's rows are the next rows of the state (the tail after a sweep-1
    fill, the nofill arm's exact rows and tail, the probe's rows from an empty state); ``prefix_len`` rows
    are already in the state. ``prefix_from_map=True``: rows ``[start, N)`` pass through the state from the
    radix-cache hit, rows not in the pass (filled rows) with ``x̂_l`` from ``st.prefix_x``.
    ``correct``: apply the terminal-state correction between the last prefix row and the first tail row.
    """

    def __init__(self, ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, positions: torch.Tensor, *,
                 prefix_from_map: bool, prefix_len: int, correct: bool = False, resources: Any = None):
        self.ctx, self.fb, self.i, self.st = ctx, fb, i, st
        self.positions = positions.to("cpu", torch.long)
        self.prefix_from_map = prefix_from_map
        self.prefix_len = prefix_len
        self.offsets = None
        if correct and st.plan.terminal_state is not None:
            offsets = getattr(resources, "offsets", {}) or {}
            self.offsets = (offsets.get(st.plan.terminal_state) or {}).get((st.plan.split, st.plan.arm))
            if self.offsets is None:
                raise RuntimeError(
                    f"terminal-state offsets {st.plan.terminal_state!r} for split {st.plan.split}, arm "
                    f"{st.plan.arm} are not loaded"
                )
        self.rho: dict[int, torch.Tensor] = {}

    def __call__(self, layer_id: int, x: torch.Tensor) -> torch.Tensor:
        if self.prefix_from_map:
            return self._through_prefix(layer_id, x)
        ad = self.ctx.adapter
        self._correct(layer_id, self.st.recurrent)
        h, mixed_qkv, a, b = ad.gdn_inputs(layer_id, x)
        core = run_sequence(self.ctx, self.fb, self.i, layer_id, mixed_qkv, a, b, prefix_len=self.prefix_len)
        return ad.finish_layer(layer_id, x, ad.gdn_output(layer_id, core, h))

    def _correct(self, layer_id: int, sums: GateSums | None) -> None:
        if self.offsets is None or sums is None:
            return
        rho = sums.rho(layer_id, cached=self.st.start > 0)
        if not rho.numel():
            return
        delta = self.offsets[layer_id]
        self.rho[layer_id] = rho
        add_to_state(self.ctx, self.fb, self.i, layer_id, rho.to(delta.device)[:, None, None] * delta)

    def _through_prefix(self, layer_id: int, x: torch.Tensor) -> torch.Tensor:
        """Rows ``[start, N)`` in order: pass rows with their inputs ``x``, filled rows with ``x̂_l``; the
        correction (if any) between rows ``B - 1`` and ``B``. Returns the pass rows' outputs."""
        ctx, st, ad = self.ctx, self.st, self.ctx.adapter
        start, boundary, n = st.start, st.boundary, st.num_tokens
        device = x.device
        in_pass = torch.full((n - start,), -1, dtype=torch.long)
        in_pass[self.positions - start] = torch.arange(self.positions.numel())
        sums = GateSums() if self.offsets is not None else None
        outs_h, outs_core = [], []
        block = max(1, ctx.chunk_rows)
        # Blocks of at most chunk_rows rows, cut at the prefix/tail boundary (the correction goes between).
        cuts = sorted({start, boundary, n} | set(range(start, n, block)))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            if lo == boundary:
                self._correct(layer_id, sums)
            idx = in_pass[lo - start : hi - start]
            exact = idx >= 0  # host
            exact_rows, filled_rows = torch.nonzero(exact).flatten(), torch.nonzero(~exact).flatten()
            keep, source, filled = to_device(device, exact_rows, idx[exact], filled_rows)
            x_in = torch.empty((hi - lo, x.shape[1]), dtype=x.dtype, device=device)
            if exact_rows.numel():
                x_in[keep] = x[source]
            if filled_rows.numel():
                x_split = st.prefix_x.gather(filled_rows + lo - start)
                x_in[filled] = _predict(ctx, st, layer_id, x_split)
            h, mixed_qkv, a, b = ad.gdn_inputs(layer_id, x_in)
            core = run_sequence(ctx, self.fb, self.i, layer_id, mixed_qkv, a, b, prefix_len=lo)
            if sums is not None and lo < boundary:
                sums.add(layer_id, ad.gdn_gates(layer_id, a), ~exact)
            outs_h.append(h[keep])
            outs_core.append(core[keep])
        h, core = torch.cat(outs_h), torch.cat(outs_core)
        return ad.finish_layer(layer_id, x, ad.gdn_output(layer_id, core, h))


def sweep_two(ctx: PassContext, fb: ForwardBatch, i: int, st: RequestState, positions: torch.Tensor) -> UpperRecurrence | None:
    """The upper GDN layers' runner of the second sweep over rows ``positions`` (exact rows and the tail), or
    ``None`` for a model without them: the tail continues the state sweep 1 filled; with exact rows the whole
    prefix passes through the state in order; nofill runs only exact rows and the tail."""
    if not has_recurrent_layers(ctx, st.plan.split):
        return None
    if fills_states_in_sweep_one(st):
        return UpperRecurrence(ctx, fb, i, st, positions, prefix_from_map=False, prefix_len=st.boundary,
                               correct=True, resources=ctx.recurrent)
    if st.plan.arm == "nofill":
        return UpperRecurrence(ctx, fb, i, st, positions, prefix_from_map=False, prefix_len=st.start)
    return UpperRecurrence(ctx, fb, i, st, positions, prefix_from_map=True, prefix_len=st.start, correct=True,
                           resources=ctx.recurrent)
