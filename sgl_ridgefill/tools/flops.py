"""Speed bounds for RidgeFill prefill: the layer-pass bound ``1/r`` and a FLOP-counted bound.

The layer-pass bound assumes every layer costs the same per row and the maps are free:

    r = S/L + (1 - S/L) * (T + E) / N        (E exact prefix rows; T and E clipped to the prompt)

The FLOP-counted bound counts multiply-adds (2 FLOPs each) of the whole prefill, exact against RidgeFill:

- per layer and row that runs the layer: the projections and the MLP, ``2 * params`` (Q, K, V, O, gate,
  up, down; biases and norms are lower order and left out);
- attention: ``4 * head_dim * heads`` per (query, key) pair, causally (``Q K^T`` and ``P V``);
- per filled row and upper layer: the map, ``2 * d_in * d_out``, and the fill's K/V projection,
  ``2 * d * 2 * kv_heads * head_dim``;
- the LM head for the one row that is sampled, and an optional selector cost.

Hybrid models (Gated DeltaNet layers between attention layers: Qwen3.5, Qwen3-Next) count each layer by
kind. A GDN layer has no attention pairs; per row it costs its projections (``[q|k|v|z]``, ``[b|a]``,
``out_proj``), the MLP, the short conv (``2 * conv_dim * width``) and the recurrence (``8 * HV * V * K``:
decay, read, update and output of each value head's ``[V, K]`` state). A *filled* row still costs an upper
GDN layer its map, the ``[q|k|v]`` and ``[b|a]`` projections (no ``z``), the conv and the recurrence: it
updates the state the tail inherits. Only its ``z`` projection, output norm, ``out_proj`` and MLP are
saved, so the attention-only ratio overstates the saving on hybrids. Attention layers of Qwen3.5 also
project an output gate (``q_proj`` is twice as wide).

Exact prefix rows are assumed spread evenly over the prefix (their attention pairs are counted at the
prefix's mean position). Nothing here imports SGLang.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..arch import HYBRID_MODEL_TYPES

# The attention top-k selector reads the attention of this many last prompt rows.
SELECTOR_QUERY_ROWS = 64


ATTENTION, GDN = "attention", "gdn"
_HF_KINDS = {"full_attention": ATTENTION, "attention": ATTENTION, "linear_attention": GDN}
_GATED_ATTENTION_TYPES = HYBRID_MODEL_TYPES  # the hybrids gate their attention output (arch.py)


@dataclasses.dataclass(frozen=True)
class LinearDims:
    """A Gated DeltaNet layer's sizes: key/value heads, their widths, the conv width."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_width: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclasses.dataclass(frozen=True)
class ModelDims:
    """The sizes of a decoder that the FLOP count needs. ``layer_kinds`` (``attention`` / ``gdn`` per layer)
    and ``linear`` describe a hybrid; a dense model leaves them empty. ``attn_output_gate``: the attention's
    Q projection also produces an output gate (Qwen3.5)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    layer_kinds: tuple[str, ...] = ()
    linear: LinearDims | None = None
    attn_output_gate: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name in ("layer_kinds", "linear", "attn_output_gate"):
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelDims.{field.name} must be a positive integer, got {value!r}")
        if self.layer_kinds:
            if len(self.layer_kinds) != self.num_layers or set(self.layer_kinds) - {ATTENTION, GDN}:
                raise ValueError(f"ModelDims.layer_kinds must give attention or gdn for each of {self.num_layers} layers")
            if GDN in self.layer_kinds and self.linear is None:
                raise ValueError("ModelDims: a model with gdn layers needs its LinearDims")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], *, source: str = "config") -> ModelDims:
        """Read the sizes from a Hugging Face ``config.json`` dict (``text_config`` is looked into)."""
        if isinstance(config.get("text_config"), Mapping):
            config = config["text_config"]
        missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size") if config.get(k) is None]
        if missing:
            raise ValueError(f"{source}: missing {', '.join(missing)}; cannot count FLOPs for this model")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        kinds: tuple[str, ...] = ()
        linear = None
        if config.get("layer_types"):
            kinds = tuple(_HF_KINDS.get(t, ATTENTION) for t in config["layer_types"])
        elif config.get("full_attention_interval"):
            every = int(config["full_attention_interval"])
            kinds = tuple(ATTENTION if (l + 1) % every == 0 else GDN for l in range(layers))
        if GDN in kinds:
            linear = LinearDims(
                num_key_heads=int(config["linear_num_key_heads"]), num_value_heads=int(config["linear_num_value_heads"]),
                key_head_dim=int(config["linear_key_head_dim"]), value_head_dim=int(config["linear_value_head_dim"]),
                conv_width=int(config.get("linear_conv_kernel_dim") or 4),
            )
        else:
            kinds = ()
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            layer_kinds=kinds,
            linear=linear,
            attn_output_gate=bool(config.get("attn_output_gate", config.get("model_type") in _GATED_ATTENTION_TYPES)),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one attention layer's projections and MLP (Q (and its output gate), K, V, O, gate, up, down)."""
        d = self.hidden_size
        q_out = self.q_size * (2 if self.attn_output_gate else 1)
        attention = d * q_out + 2 * d * self.kv_size + self.q_size * d
        return attention + 3 * d * self.intermediate_size

    def kinds(self) -> tuple[str, ...]:
        return self.layer_kinds or (ATTENTION,) * self.num_layers

    def _linear(self) -> LinearDims:
        assert self.linear is not None
        return self.linear

    @property
    def gdn_state_flops(self) -> float:
        """The short conv and the recurrence of one row in one GDN layer."""
        lin = self._linear()
        return float(2 * lin.conv_dim * lin.conv_width + 8 * lin.num_value_heads * lin.value_head_dim * lin.key_head_dim)

    @property
    def gdn_row_flops(self) -> float:
        """One exact row through one GDN layer: projections, out_proj, MLP, conv and recurrence."""
        lin, d = self._linear(), self.hidden_size
        params = d * (lin.conv_dim + lin.value_dim) + d * 2 * lin.num_value_heads + lin.value_dim * d
        return float(2 * (params + 3 * d * self.intermediate_size)) + self.gdn_state_flops

    @property
    def gdn_fill_flops(self) -> float:
        """One filled row in one upper GDN layer, the map excluded: ``[q|k|v]``, ``[b|a]``, conv, recurrence."""
        lin, d = self._linear(), self.hidden_size
        return float(2 * d * (lin.conv_dim + 2 * lin.num_value_heads)) + self.gdn_state_flops


@dataclasses.dataclass(frozen=True)
class RidgeFillShape:
    """One prefill: ``num_tokens`` prompt rows, split layer ``split``, tail ``tail``, ``exact_rows`` selected,
    filled with maps of kind ``map_kind`` (``maps/kinds.py``; ``None``: the paper's residual map)."""

    num_tokens: int
    split: int
    tail: int
    exact_rows: int = 0
    map_kind: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_tokens", "split", "tail"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.exact_rows, bool) or not isinstance(self.exact_rows, int) or self.exact_rows < 0:
            raise ValueError(f"exact_rows must be a non-negative integer, got {self.exact_rows!r}")
        if self.exact_rows > self.prefix:
            raise ValueError(f"exact_rows {self.exact_rows} exceeds the prefix of {self.prefix} rows (N={self.num_tokens}, T={self.tail})")
        if self.map_kind is not None:
            from ..maps.kinds import map_kind  # imports torch: only for shapes that name a kind

            map_kind(self.map_kind)  # an unknown kind fails here, before a benchmark sends a request

    @property
    def tail_rows(self) -> int:
        """The tail clipped to the prompt: a prompt shorter than ``T`` runs exactly."""
        return min(self.tail, self.num_tokens)

    @property
    def prefix(self) -> int:
        return self.num_tokens - self.tail_rows

    @property
    def filled_rows(self) -> int:
        return self.prefix - self.exact_rows


def _check_split(shape: RidgeFillShape, num_layers: int) -> None:
    if not 1 <= shape.split <= num_layers:
        raise ValueError(f"split {shape.split} is outside 1..{num_layers} for a {num_layers}-layer model")


def layer_pass_fraction(shape: RidgeFillShape, num_layers: int) -> float:
    """``r = S/L + (1 - S/L) * (T + E) / N``: the share of layer passes RidgeFill still runs."""
    _check_split(shape, num_layers)
    s = shape.split / num_layers
    return s + (1 - s) * (shape.tail_rows + shape.exact_rows) / shape.num_tokens


def layer_pass_bound(shape: RidgeFillShape, num_layers: int) -> float:
    """The speed bound ``1 / r``."""
    return 1.0 / layer_pass_fraction(shape, num_layers)


def causal_pairs(first: int, count: int) -> int:
    """(query, key) pairs of ``count`` consecutive rows starting at position ``first``, causally."""
    return count * (first + 1) + count * (count - 1) // 2


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one prefill, split by where they go (all floats, in FLOPs)."""

    linear: float
    attention: float
    fill: float = 0.0
    selector: float = 0.0
    lm_head: float = 0.0

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.fill + self.selector + self.lm_head


def _row_flops(dims: ModelDims, kind: str) -> float:
    """One exact row through one layer of ``kind``, attention pairs excluded."""
    return float(2 * dims.layer_params) if kind == ATTENTION else dims.gdn_row_flops


def exact_prefill_flops(dims: ModelDims, num_tokens: int) -> FlopCount:
    """Every layer for every row of an ``num_tokens``-row prompt."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    n, kinds = num_tokens, dims.kinds()
    attn_per_pair = 4 * dims.head_dim * dims.num_heads
    return FlopCount(
        linear=float(n * sum(_row_flops(dims, kind) for kind in kinds)),
        attention=float(kinds.count(ATTENTION) * attn_per_pair * causal_pairs(0, n)),
        lm_head=float(2 * dims.hidden_size * dims.vocab_size),
    )


def ridgefill_prefill_flops(dims: ModelDims, shape: RidgeFillShape, *, selector_flops: float = 0.0) -> FlopCount:
    """RidgeFill: lower layers for every row, the fill for filled rows, upper layers for tail and exact rows.
    A filled row in an upper GDN layer is counted with what it still costs there (``ModelDims.gdn_fill_flops``)."""
    _check_split(shape, dims.num_layers)
    n, s = shape.num_tokens, shape.split
    kinds = dims.kinds()
    lower, upper = kinds[:s], kinds[s:]
    attn_per_pair = 4 * dims.head_dim * dims.num_heads
    exact_upper_rows = shape.tail_rows + shape.exact_rows
    # Exact rows spread evenly over the prefix: on average a row at position (prefix - 1) / 2 sees
    # (prefix + 1) / 2 keys.
    exact_pairs = shape.exact_rows * (shape.prefix + 1) / 2
    upper_pairs = causal_pairs(shape.prefix, shape.tail_rows) + exact_pairs
    from ..maps.kinds import map_kind  # the map, then (kinds that predict the layer's input) its K/V projections

    map_flops = 2 * dims.hidden_size * dims.hidden_size  # a GDN layer takes the residual map's prediction
    fill_per_row = {ATTENTION: float(map_kind(shape.map_kind).fill_flops(dims.hidden_size, dims.kv_size))}
    if GDN in upper:
        fill_per_row[GDN] = map_flops + dims.gdn_fill_flops
    return FlopCount(
        linear=float(n * sum(_row_flops(dims, k) for k in lower) + exact_upper_rows * sum(_row_flops(dims, k) for k in upper)),
        attention=float(attn_per_pair * (lower.count(ATTENTION) * causal_pairs(0, n) + upper.count(ATTENTION) * upper_pairs)),
        fill=float(shape.filled_rows * sum(fill_per_row[k] for k in upper)),
        selector=float(selector_flops),
        lm_head=float(2 * dims.hidden_size * dims.vocab_size),
    )


def attention_selector_flops(dims: ModelDims, num_tokens: int, layers: int, query_rows: int = SELECTOR_QUERY_ROWS) -> float:
    """The attention top-k selector: scores of the last ``query_rows`` rows against every key
    (``2 * head_dim * heads`` per pair) in ``layers`` sub-split layers. Its queries come for free
    from the lower pass."""
    if layers < 0 or query_rows < 0:
        raise ValueError(f"layers and query_rows must be >= 0, got {layers} and {query_rows}")
    q = min(query_rows, num_tokens)
    return float(layers * 2 * dims.head_dim * dims.num_heads * q * num_tokens)


def flop_bound(dims: ModelDims, shape: RidgeFillShape, *, selector_flops: float = 0.0) -> float:
    """Exact prefill FLOPs over RidgeFill's: the FLOP-counted speed bound."""
    exact = exact_prefill_flops(dims, shape.num_tokens).total
    return exact / ridgefill_prefill_flops(dims, shape, selector_flops=selector_flops).total
