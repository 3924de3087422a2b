"""What each map kind is fitted to: the features and targets of one forward piece, into the statistics.

A piece is one forward pass from position 0, and its captured layer inputs ``x_l`` (``[n, d]``, the
model's dtype) give, for split ``S`` and each kind (``maps/kinds.py``):

- features ``z``: :func:`~sgl_ridgefill.maps.kinds.features` of ``x_S`` (``x_S`` itself, ``u_S``, or
  ``[u_S(j), u_S(j-1), e(j)]`` from a fresh context per piece, as serving starts one per prompt);
- targets ``y_l`` per upper layer: ``x_l``, ``u_l = x_l / rms(x_l)``, or ``[k_l, v_l]``, the layer's K
  (before its K norm and RoPE) and V computed by the model's own ``input_layernorm`` and ``k_proj`` /
  ``v_proj`` in float32;
- ``p_l``, identity fill's prediction of ``y_l``: the same target computed from ``x_S`` in place of ``x_l``.

Sink rows (:func:`~sgl_ridgefill.maps.kinds.sink_rows` on ``x_S``) are served exactly, so they are left out
of the training statistics and of the held-out statistics of normal rows; the held-out statistics of all
rows keep them. Everything is accumulated one upper layer at a time into float64 totals, from products
formed in the pass's accumulation dtype (``vocabulary.ACCUMULATIONS``: float64, or float32 per piece).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import torch

from sgl_ridgefill.maps.kinds import SINK_FIRST_ROWS, SINK_NORM_RATIO, MapKind, features, map_kind, sink_rows

from .capture import decoder_layers
from .stats import SplitStats


def sink_rule() -> dict[str, Any]:
    """The rule of the rows left out of the fit (and served exactly), as the maps manifest records it."""
    return {"first_rows": SINK_FIRST_ROWS, "norm_ratio": SINK_NORM_RATIO}


@dataclasses.dataclass(frozen=True)
class KVProjection:
    """One layer's K and V of its input, as the model computes them before its K norm and RoPE.

    ``norm``: the layer's ``input_layernorm``; ``weight``: ``[2 kv_dim, d]`` float32 (``k_proj`` rows, then
    ``v_proj``); ``bias``: ``[2 kv_dim]`` float32 (zeros without projection biases)."""

    norm: torch.nn.Module
    weight: torch.Tensor
    bias: torch.Tensor

    @classmethod
    def of(cls, layer: torch.nn.Module) -> KVProjection:
        attn = layer.self_attn
        projs = (attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight.detach().float() for p in projs])
        bias = torch.cat([p.bias.detach().float() if p.bias is not None else
                          torch.zeros(p.out_features, device=p.weight.device) for p in projs])
        return cls(layer.input_layernorm, weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``[k, v]`` of inputs ``x``: ``[n, d] -> [n, 2 kv_dim]`` float32."""
        with torch.no_grad():
            # The norm upcasts to float32 itself; with float32 input its output stays float32 in any model dtype.
            h = self.norm(x.to(self.weight.device).float()).float()  # on the layer's device (a spread model)
            return torch.nn.functional.linear(h, self.weight, self.bias).to(x.device)

    def exact_map(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A [2 kv_dim, d], b [2 kv_dim])`` float64 with ``[k, v] = A u + b`` for ``u = x / rms(x)``: the
        layer's RMSNorm is ``gamma * u`` (up to its epsilon), so the map of the split layer itself is exact."""
        gamma = self.norm.weight.detach().double().cpu()
        return self.weight.double().cpu() * gamma[None, :], self.bias.double().cpu()


def kv_projections(model: torch.nn.Module, layers: Sequence[int]) -> dict[int, KVProjection]:
    stack = decoder_layers(model)
    return {layer: KVProjection.of(stack[layer]) for layer in layers}


def kv_dim(model: torch.nn.Module) -> int:
    """``num_kv_heads * head_dim``: the width of one attention layer's K (and of its V)."""
    attention = [layer for layer in decoder_layers(model) if hasattr(layer, "self_attn")]
    return int(attention[0].self_attn.k_proj.out_features)


def recurrent_layers(model: torch.nn.Module) -> list[int]:
    """The decoder layers of an HF hybrid whose mixer is Gated DeltaNet (``linear_attn``)."""
    return [i for i, layer in enumerate(decoder_layers(model)) if hasattr(layer, "linear_attn")]


class Accumulator:
    """Adds forward pieces to the statistics of every ``(split, kind)`` of a run.

    ``kinds``: map kind names; ``projections``: per upper layer (and split layer) its :class:`KVProjection`,
    needed only by ``kv`` kinds; ``sink``: the rule of :func:`sink_rows` (``first_rows``, ``norm_ratio``);
    ``dtype``: what the features and targets are cast to before their products (float64 or float32)."""

    def __init__(self, kinds: Sequence[str], projections: Mapping[int, KVProjection], sink: Mapping[str, Any],
                 dtype: torch.dtype = torch.float64):
        self.kinds: tuple[MapKind, ...] = tuple(map_kind(k) for k in kinds)
        self.projections = projections
        self.sink = dict(sink)
        self.dtype = dtype

    def add(
        self,
        states: Mapping[int, torch.Tensor],
        split: int,
        normal: Mapping[str, SplitStats],
        every: Mapping[str, SplitStats] | None = None,
    ) -> int:
        """Accumulate one piece for split ``split`` and return its number of sink rows.

        ``states``: ``{l: x_l [n, d]}`` for ``split`` and every upper layer; ``normal``: per kind name, the
        statistics its rows without sinks go to; ``every``: per kind name, those all its rows go to (or
        ``None``)."""
        x_split = states[split]
        n = x_split.shape[0]
        keep = ~sink_rows(torch.arange(n), x_split, **self.sink)
        z_all = {kind.name: self.features(kind, x_split) for kind in self.kinds}
        z_keep = {name: z[keep] for name, z in z_all.items()}
        for kind in self.kinds:
            normal[kind.name].add_features(z_keep[kind.name])
            if every is not None:
                every[kind.name].add_features(z_all[kind.name])
        num_layers = normal[self.kinds[0].name].num_layers
        for index, layer in enumerate(range(split, num_layers)):
            by_target: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
            for kind in self.kinds:
                if kind.target not in by_target:
                    by_target[kind.target] = (self.target(kind, layer, states[layer]), self.target(kind, layer, x_split))
                y, p = by_target[kind.target]
                normal[kind.name].add_layer(index, z_keep[kind.name], y[keep], p[keep])
                if every is not None:
                    every[kind.name].add_layer(index, z_all[kind.name], y, p)
        return int(n - keep.sum())

    def features(self, kind: MapKind, x_split: torch.Tensor) -> torch.Tensor:
        """``z``: ``[n, d_in]`` of one piece's split states (a fresh context: the piece starts at 0)."""
        if kind.features == "x":
            return x_split.to(self.dtype)
        z, _ = features(kind, x_split.float())
        return z.to(self.dtype)

    def target(self, kind: MapKind, layer: int, x: torch.Tensor) -> torch.Tensor:
        """``y``: ``[n, d_out]``, what ``kind`` predicts at ``layer`` when its input is ``x`` ``[n, d]``."""
        project = self.projections.get(layer) if kind.predicts_kv else None
        return kind.target_of(x, project).to(self.dtype)  # rms_normalise works in float32 or wider
