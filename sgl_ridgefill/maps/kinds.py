"""What a map predicts from what: the map kinds, declared once for calibration and serving.

Every kind is one linear map per upper layer ``l``, ``y_l = A_l z + b_l``, fitted in closed form by ridge on
float64 sufficient statistics. Kinds differ in the features ``z`` of a filled row and in the target ``y_l``:

- ``residual``: ``z = x_S``, ``y_l = x_l`` (the paper's map: the layer's input, through its own norm and K/V);
- ``normalised``: ``z = x_S``, ``y_l = u_l = x_l / rms(x_l)`` (K and V depend on ``x_l`` only through ``u_l``;
  the layer's RMSNorm is scale-free, so serving is the residual kind's);
- ``kv``: ``z = u_S``, ``y_l = [k_l, v_l]``, the layer's K (before its K norm and RoPE) and V straight from
  the normalised split state: ``d -> 2 * kv_dim`` per layer, cheaper to apply;
- ``kv+context``: ``z = [u_S(j), u_S(j-1), e(j)]`` with ``e`` the causal running mean
  ``e(j) = beta * e(j-1) + (1 - beta) * u_S(j)`` (``e(-1) = 0``; ``u_S(-1) = 0``): a filled row never sees
  another position in the upper layers, and this gives it its neighbours' split states.

A kind carries its behaviour: its features (:func:`features`), its calibration target
(:meth:`MapKind.target_of`), what serving does with a prediction (:meth:`MapKind.key_value`,
:meth:`MapKind.value`), its cost (:meth:`MapKind.fill_flops`) and where it cannot serve
(:meth:`MapKind.refusal`); calibration, the fill, the solver and the server's startup checks ask the kind.
Adding a kind is one entry of :data:`MAP_KINDS` (a new ``features`` or ``target`` also one branch here).

*Sink rows* (position 0 and any row whose split state is massive) dominate ``X^T X`` if left in: they are
left out of the statistics and run exactly when served (:func:`sink_rows`). Engine-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

RMS_EPS = 1e-6
CONTEXT_BETA = 0.9
SINK_FIRST_ROWS = 1
SINK_NORM_RATIO = 10.0  # sinks sit at 50-150x the median row norm at half depth; normal rows rarely reach 10x


@dataclass(frozen=True)
class MapKind:
    name: str
    features: str  # "x" (the split state) | "u" (normalised) | "u+context"
    target: str  # "x" (the layer input) | "u" (normalised) | "kv" (the layer's K and V)
    doc: str

    @property
    def predicts_kv(self) -> bool:
        return self.target == "kv"

    @property
    def context(self) -> bool:
        return self.features == "u+context"

    def d_in(self, hidden: int) -> int:
        return 3 * hidden if self.context else hidden

    def d_out(self, hidden: int, kv_dim: int) -> int:
        return 2 * kv_dim if self.predicts_kv else hidden

    @property
    def scale_free_target(self) -> bool:
        """The target is the normalised input: the layer's scale-free norm serves it as the input itself."""
        return self.target == "u"

    def target_of(self, x: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """What this kind predicts at a layer whose input is ``x`` (``[n, d]``): ``x``, ``x / rms(x)``, or the
        layer's K and V before its K norm and RoPE (``project``: the layer's ``[W_k; W_v]`` after its norm)."""
        if self.target == "x":
            return x
        if self.target == "u":
            return rms_normalise(x)
        if project is None:
            raise ValueError(f"{self.name} maps predict K and V: their target needs the layer's K/V projection")
        return project(x)

    def key_value(self, adapter: Any, layer_id: int, positions: torch.Tensor, y: torch.Tensor):
        """K (after its norm and RoPE) and V ``[rows, kv_heads, head_dim]`` that layer ``layer_id`` writes for
        filled rows from this kind's prediction ``y`` (``adapter``: the served model's ``ModelAdapter``)."""
        if not self.predicts_kv:  # the layer's input: its own norm, K/V projections and RoPE
            return adapter.key_value(layer_id, positions, y)
        shape = adapter.shape
        k, v = y.split([shape.kv_dim, shape.kv_dim], dim=-1)
        return adapter.rope_key(layer_id, positions, k), v.reshape(-1, shape.num_kv_heads, shape.head_dim)

    def value(self, adapter: Any, layer_id: int, y: torch.Tensor) -> torch.Tensor:
        """V alone from the prediction ``y`` (the value rescale compares it with the exact V)."""
        if not self.predicts_kv:
            return adapter.value(layer_id, y)
        shape = adapter.shape
        return y[:, shape.kv_dim :].reshape(-1, shape.num_kv_heads, shape.head_dim)

    def refusal(self, *, hybrid: bool = False, tp_size: int = 1) -> str | None:
        """Why maps of this kind cannot serve a process (a hybrid model; ``tp_size`` tensor-parallel ranks), or
        ``None``."""
        if hybrid and self.predicts_kv:
            return (f"{self.name} maps predict K and V only, and this hybrid model's upper Gated DeltaNet layers "
                    "need their input: serve residual or normalised maps")
        if tp_size > 1 and self.predicts_kv:
            return (f"{self.name} maps predict K and V of every KV head, and this rank holds {tp_size}-way shards "
                    "of them: under tensor parallelism serve residual or normalised maps")
        return None

    def fill_flops(self, hidden: int, kv_dim: int) -> int:
        """What filling one row of one upper attention layer costs (2 FLOP per multiply-add): the map, and for
        kinds that predict the layer's input, its K and V projections (the norm and RoPE are left out)."""
        projections = 0 if self.predicts_kv else 2 * hidden * 2 * kv_dim
        return 2 * self.d_in(hidden) * self.d_out(hidden, kv_dim) + projections


MAP_KINDS: dict[str, MapKind] = {
    k.name: k
    for k in (
        MapKind("residual", "x", "x", "the layer's input from the split state (the paper's map)"),
        MapKind("normalised", "x", "u", "the layer's normalised input x_l/rms(x_l) from the split state"),
        MapKind("kv", "u", "kv", "the layer's K and V from the normalised split state"),
        MapKind("kv+context", "u+context", "kv",
                "the layer's K and V from the normalised split states of the row and the row before, and their "
                "causal running mean"),
    )
}
DEFAULT_KIND = "residual"


def map_kind(name: str | None) -> MapKind:
    """The kind called ``name`` (``None``: the residual kind, what every folder without a kind holds)."""
    kind = MAP_KINDS.get(name or DEFAULT_KIND)
    if kind is None:
        raise ValueError(f"unknown map kind {name!r}; known: {', '.join(MAP_KINDS)}")
    return kind


def rms_normalise(x: torch.Tensor) -> torch.Tensor:
    """``x / rms(x)`` row-wise, in float32 or wider: ``[n, d] -> [n, d]``."""
    x = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)


@dataclass
class ContextState:
    """What a ``kv+context`` feature needs from the rows before a block: ``u_S`` of the last row and the
    running mean after it (``[d]`` each); zeros before the first row of a prompt."""

    last_u: torch.Tensor
    mean: torch.Tensor

    @classmethod
    def start(cls, d: int, *, dtype=torch.float32, device=None) -> ContextState:
        zeros = torch.zeros(d, dtype=dtype, device=device)
        return cls(zeros, zeros.clone())


def features(kind: MapKind, x_split: torch.Tensor, state: ContextState | None = None) -> tuple[torch.Tensor, ContextState | None]:
    """The map's features of consecutive rows and the context state after them.

    ``x_split``: ``[n, d]`` split states of consecutive positions; ``state``: the context before the first
    of them (``kv+context`` only; ``None`` = the start of the prompt). Returns ``z``: ``[n, d_in]`` in
    ``x_split``'s dtype for ``x`` features, float32 or wider otherwise.
    """
    if kind.features == "x":
        return x_split, None
    u = rms_normalise(x_split)
    if not kind.context:
        return u, None
    if state is None:
        state = ContextState.start(u.shape[1], dtype=u.dtype, device=u.device)
    lag = torch.cat([state.last_u.to(u)[None], u[:-1]])
    mean = _running_mean(u, state.mean.to(u), CONTEXT_BETA)
    return torch.cat([u, lag, mean], dim=1), ContextState(u[-1].clone(), mean[-1].clone())


def _running_mean(u: torch.Tensor, before: torch.Tensor, beta: float, block: int = 64) -> torch.Tensor:
    """``e(j) = beta e(j-1) + (1 - beta) u(j)`` for every row, ``e(-1) = before``: ``[n, d]``.

    Within a block of ``block`` rows the recurrence is a weighted cumulative sum (``beta^-i`` stays below
    ``beta^-block`` ~ 850 at 64 rows, so float32 keeps it exact enough); blocks carry the state forward."""
    out = torch.empty_like(u)
    carry = before
    for lo in range(0, u.shape[0], block):
        chunk = u[lo : lo + block]
        i = torch.arange(chunk.shape[0], dtype=u.dtype, device=u.device)
        up = beta ** (-(i + 1))[:, None]  # beta^-(i+1)
        down = beta ** (i + 1)[:, None]  # beta^(i+1)
        out[lo : lo + block] = down * (carry[None] + (1 - beta) * torch.cumsum(chunk * up, dim=0))
        carry = out[lo + chunk.shape[0] - 1]
    return out


def sink_rows(positions: torch.Tensor, x_split: torch.Tensor, *, first_rows: int, norm_ratio: float) -> torch.Tensor:
    """Which rows are attention sinks: ``[n]`` bool, the rows at positions below ``first_rows`` and those
    whose split-state norm exceeds ``norm_ratio`` times the median norm of the block (``x_split``:
    ``[n, d]`` rows of one forward; ``positions``: ``[n]``)."""
    norms = x_split.float().norm(dim=-1)
    massive = norms > norm_ratio * norms.median() if norms.numel() else norms.bool()
    return (positions.to(norms.device) < first_rows) | massive
