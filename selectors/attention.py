"""``attention_topk``: the prefix rows that receive the most attention from the question.

A filled row's value error moves a query's output by ``a_ij * delta`` and its logit error by at most
``2 V a_ij (e^|eps| - 1)``; both scale with the attention ``a_ij`` the row receives, so the most
attended rows are the ones to compute exactly.

Attention peaks on a few tokens of a passage (a needle's key word, one digit of its number), while reading
the passage back needs all of it. ``pool`` ranks each row by the most attention any row within ``pool``
positions of it receives (max-pooling, as SnapKV pools its votes), so a chosen peak brings its
neighbours. A window stops short of a passage longer than it: a needle of twenty tokens whose peak is its
key word loses its number's last digits. ``sentence`` ranks each row of a short sentence by the most
attention any row of that sentence receives, so the sentence is chosen whole behind its peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .base import QUERY_KINDS, AttentionRequirement, SelectionInputs
from .rows import rank_by_score, share_count
from .spec import ArgumentError, BindContext, Param, SelectorSpec

# The reference study sums over whichever of these attention layers lie below the split.
DEFAULT_LAYERS = (3, 7, 11, 15)


def attention_topk(
    inputs: SelectionInputs, *, q: int, share: float, layers: tuple[int, ...], query: str, pool: int = 0,
    sentence: int = 0,
) -> torch.Tensor:
    """The prefix rows that receive the most attention from `q` query tokens (top `share` of the prefix).

    Attention is summed over all heads of the chosen attention layers below the split (default:
    whichever of layers 3, 7, 11 and 15 lie below it) and over the query tokens. `query="last"` uses
    the last `q` prompt tokens, which usually hold the question; `query="before_tail"` uses the `q`
    tokens just before the tail, a question-blind variant for caches that serve several questions.
    `pool > 0` scores every row by the largest attention within `pool` rows of it (either side), so the
    rows around each peak are chosen with it; ties keep position order, so a window is taken whole.
    `sentence > 0` also scores every row of a sentence of at most `sentence` tokens (ended by `.`, `!`, `?`
    or a line break) by the largest attention in that sentence, so a passage is chosen whole behind its
    peak; it reads the tokenizer's tokens.
    Returns ranked rows, most attended first: [round(share * prefix_len)] int64.
    """
    received = inputs.statistic(AttentionRequirement(tuple(layers), query, q), "attention_topk")
    scores = received
    if pool > 0 and received.numel() > 0:
        scores = max_pool(received, pool)
    if sentence > 0 and received.numel() > 0:
        ends = inputs.require_tokens("attention_topk").sentence_end_mask(inputs.prefix_ids)
        scores = torch.maximum(scores.float(), sentence_max(received, ends, sentence))
    return rank_by_score(scores)[: share_count(share, inputs.prefix_len)]


def max_pool(scores: torch.Tensor, radius: int) -> torch.Tensor:
    """``out[j] = max(scores[j - radius : j + radius + 1])`` (clipped at the ends): ``[n] -> [n]`` float32."""
    radius = min(radius, scores.numel())  # a window wider than the prefix is the whole prefix
    padded = scores.float().reshape(1, 1, -1)
    return F.max_pool1d(F.pad(padded, (radius, radius), value=float("-inf")), 2 * radius + 1, stride=1).reshape(-1)


def sentence_max(scores: torch.Tensor, ends: torch.Tensor, longest: int) -> torch.Tensor:
    """``out[j]``: the largest score in row ``j``'s sentence when that sentence has at most ``longest`` rows,
    else ``-inf``. ``ends`` ([n] bool) marks the row that ends each sentence (it belongs to the sentence
    it ends); the rows after the last end are a sentence too. ``[n] -> [n]`` float32."""
    ends = ends.to(torch.int64)
    sentence = torch.cumsum(ends, 0) - ends  # the number of sentences ended before each row
    count = int(sentence[-1]) + 1
    values = scores.float()
    peak = torch.full((count,), float("-inf")).scatter_reduce(0, sentence, values, "amax", include_self=False)
    short = torch.bincount(sentence, minlength=count) <= longest
    return torch.where(short, peak, torch.full_like(peak, float("-inf"))).index_select(0, sentence)


def _resolve(args: dict[str, Any], ctx: BindContext) -> dict[str, Any]:
    explicit = args["layers"] is not None
    layers = tuple(args["layers"]) if explicit else DEFAULT_LAYERS
    if explicit:
        if not layers:
            raise ArgumentError("attention_topk(layers=[]) names no layer", "layers")
        if len(set(layers)) != len(layers):
            raise ArgumentError(f"attention_topk(layers=...) names a layer twice: {list(layers)}", "layers")
        for layer in layers:
            if layer < 0 or (ctx.num_layers is not None and layer >= ctx.num_layers):
                bound = f" (the model has {ctx.num_layers} layers)" if ctx.num_layers is not None else ""
                raise ArgumentError(f"attention_topk(): layer {layer} does not exist{bound}", "layers")
            if ctx.split is not None and layer >= ctx.split:
                raise ArgumentError(
                    f"attention_topk(): layer {layer} is not below split {ctx.split}; attention statistics come "
                    "from the layers every row runs exactly",
                    "layers",
                )
            if ctx.attention_layers is not None and layer not in ctx.attention_layers:
                raise ArgumentError(f"attention_topk(): layer {layer} is not an attention layer of this model", "layers")
    else:
        if ctx.split is not None:
            layers = tuple(l for l in layers if l < ctx.split)
        if ctx.attention_layers is not None:
            layers = tuple(l for l in layers if l in ctx.attention_layers)
        if not layers:
            raise ArgumentError(
                f"attention_topk(): none of the default layers 3, 7, 11, 15 is an attention layer below split "
                f"{ctx.split}; choose layers with layers=[...]",
                None,
            )
    return {**args, "layers": tuple(sorted(layers))}


def _requirements(args: Mapping[str, Any]) -> tuple[AttentionRequirement, ...]:
    return (AttentionRequirement(tuple(args["layers"]), args["query"], args["q"]),)


SPEC = SelectorSpec(
    name="attention_topk",
    fn=attention_topk,
    params=(
        Param("q", "int", "query tokens whose attention is summed", default=64, minimum=1, maximum=1 << 20),
        Param("share", "share", "share of the prefix to select", default=0.10),
        Param("layers", "int_list", "attention layers below the split to sum over", default=None),
        Param("query", "str", "which tokens ask: the last q, or the q before the tail", default="last", choices=QUERY_KINDS),
        Param("pool", "int", "rows either side of a peak that share its score (0: none)", default=0, minimum=0,
              maximum=1 << 20),
        Param("sentence", "int", "longest sentence, in tokens, whose rows share its peak's score (0: none)",
              default=0, minimum=0, maximum=1 << 20),
    ),
    needs_tokens=lambda args: args["sentence"] > 0,
    resolve=_resolve,
    requirements=_requirements,
    expected_rows=lambda args, n: share_count(args["share"], n),
)
