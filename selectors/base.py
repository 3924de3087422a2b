"""What the runtime hands a compiled policy's selection, and what it must compute beforehand.

A policy compiles to a tuple of requirements (``AttentionRequirement``, ``ProbeRequirement``). The
runtime computes one statistic per requirement (``sgl_ridgefill.kernels.attention_stats`` computes
attention received per key row without materialising attention matrices), puts them in
``SelectionInputs`` under the requirement as key, and calls ``CompiledPolicy.select``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Union

import torch

from .tokens import TokenTable

__all__ = [
    "QUERY_KINDS",
    "AttentionRequirement",
    "ProbeRequirement",
    "Requirement",
    "SelectionError",
    "SelectionInputs",
    "TokenTable",
]

# "last": the last q prompt tokens (in the tail, so usually the question).
# "before_tail": the q tokens just before the tail, which never include a trailing question.
QUERY_KINDS = ("last", "before_tail")


class SelectionError(ValueError):
    """Selection inputs do not hold what the compiled policy needs (a runtime wiring error)."""


@dataclasses.dataclass(frozen=True)
class AttentionRequirement:
    """Attention received by every prefix row from ``q`` query rows, summed over heads, query rows
    and ``layers``.

    layers: attention layers below the split (every row runs them exactly), ascending.
    query: ``"last"`` (queries are the last ``q`` prompt tokens) or ``"before_tail"`` (the ``q`` tokens
    just before the tail: positions ``[max(0, P - q), P)`` for prefix length ``P``; question-blind).
    The statistic the runtime supplies is ``[prefix_len]`` float32.
    """

    layers: tuple[int, ...]
    query: str
    q: int

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        if not layers or any(not isinstance(l, int) or isinstance(l, bool) or l < 0 for l in layers):
            raise ValueError(f"AttentionRequirement.layers must be non-negative layer indices, got {layers!r}")
        if list(layers) != sorted(set(layers)):
            raise ValueError(f"AttentionRequirement.layers must be ascending and unique, got {layers!r}")
        if self.query not in QUERY_KINDS:
            raise ValueError(f"AttentionRequirement.query must be one of {QUERY_KINDS}, got {self.query!r}")
        if not isinstance(self.q, int) or isinstance(self.q, bool) or self.q < 1:
            raise ValueError(f"AttentionRequirement.q must be a positive integer, got {self.q!r}")
        object.__setattr__(self, "layers", layers)

    def describe(self) -> str:
        who = f"the last {self.q} prompt tokens" if self.query == "last" else f"the {self.q} tokens before the tail"
        layers = ", ".join(str(l) for l in self.layers)
        return f"attention received from {who}, summed over heads of layers {layers}"


@dataclasses.dataclass(frozen=True)
class ProbeRequirement:
    """Attention the last ``rows`` prompt rows give every prefix row when they run the exact upper
    layers over the filled cache, summed over heads, probe rows and upper attention layers.

    The statistic the runtime supplies is ``[prefix_len]`` float32.
    """

    rows: int

    def __post_init__(self) -> None:
        if not isinstance(self.rows, int) or isinstance(self.rows, bool) or self.rows < 1:
            raise ValueError(f"ProbeRequirement.rows must be a positive integer, got {self.rows!r}")

    def describe(self) -> str:
        return f"probe: the last {self.rows} prompt rows through the exact upper layers over the filled cache"


Requirement = Union[AttentionRequirement, ProbeRequirement]


@dataclasses.dataclass(frozen=True, eq=False)
class SelectionInputs:
    """Everything a selection may read for one request.

    token_ids: [N] int64, the whole prompt.
    prefix_len: N - T; selectors only return positions below it.
    seed: per-request seed (random control; the same seed gives the same rows in every arm).
    tokens: vocabulary facts, needed by token-level selectors.
    token_counts: [V] unigram counts from the maps folder (selectors apply add-one smoothing).
    attention: per ``AttentionRequirement``, [prefix_len] float32 attention received.
    probe: per ``ProbeRequirement``, [prefix_len] float32 attention received.
    """

    token_ids: torch.Tensor
    prefix_len: int
    seed: int = 0
    tokens: TokenTable | None = None
    token_counts: torch.Tensor | None = None
    attention: Mapping[AttentionRequirement, torch.Tensor] = dataclasses.field(default_factory=dict)
    probe: Mapping[ProbeRequirement, torch.Tensor] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = self.token_ids
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"SelectionInputs.token_ids must be a 1-D integer tensor, got {shape}")
        n = ids.numel()
        if not isinstance(self.prefix_len, int) or isinstance(self.prefix_len, bool) or not 0 <= self.prefix_len <= n:
            raise ValueError(f"SelectionInputs.prefix_len must be an integer in [0, {n}], got {self.prefix_len!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"SelectionInputs.seed must be an integer, got {self.seed!r}")
        if self.token_counts is not None and self.token_counts.dim() != 1:
            raise ValueError(
                f"SelectionInputs.token_counts must be 1-D [vocab], got shape {tuple(self.token_counts.shape)}"
            )
        # Selection is bookkeeping over a few thousand rows: it runs on the CPU whatever the model's device.
        object.__setattr__(self, "token_ids", ids.detach().to("cpu", torch.int64))

    @property
    def prefix_ids(self) -> torch.Tensor:
        """[prefix_len] int64: the prefix's token ids."""
        return self.token_ids[: self.prefix_len]

    def require_tokens(self, selector: str) -> TokenTable:
        if self.tokens is None:
            raise SelectionError(f"{selector}() needs SelectionInputs.tokens (a TokenTable for the model's tokenizer)")
        return self.tokens

    def require_token_counts(self, selector: str) -> torch.Tensor:
        if self.token_counts is None:
            raise SelectionError(f"{selector}() needs SelectionInputs.token_counts (unigram counts from the maps folder)")
        return self.token_counts.detach().cpu()

    def statistic(self, requirement: Requirement, selector: str) -> torch.Tensor:
        """The runtime's statistic for ``requirement``: [prefix_len] float32."""
        table = self.attention if isinstance(requirement, AttentionRequirement) else self.probe
        if requirement not in table:
            raise SelectionError(
                f"{selector}() needs the statistic for {requirement!r}, which SelectionInputs does not hold; "
                "the runtime must compute every entry of CompiledPolicy.requirements"
            )
        stat = table[requirement]
        if stat.dim() != 1 or stat.numel() != self.prefix_len:
            raise SelectionError(
                f"{selector}(): the statistic for {requirement!r} has shape {tuple(stat.shape)}, "
                f"expected [{self.prefix_len}] (the prefix length)"
            )
        return stat.detach().to("cpu", torch.float32)
