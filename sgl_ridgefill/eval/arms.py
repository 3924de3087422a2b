"""The arms and controls an evaluation compares, as per-request ``custom_params["ridgefill"]``.

The RidgeFill server an evaluation talks to runs with a rows policy (``rows_policy_text``) as its own
policy, so an arm without ``"policy"`` gets the policy's selected rows; the arms without rows name the
shipped ``plain`` policy (no selection). Every arm carries the split and tail explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..bench.bounds import ModelDims, RidgeFillShape, ridgefill_prefill_flops
from ..request_schema import SPLICES

EXACT, NOFILL, IDENTITY, RIDGEFILL = "exact", "nofill", "identity", "ridgefill"
IDENTITY_ROWS, RIDGEFILL_ROWS, RIDGEFILL_RANDOM, NOFILL_LONGTAIL = (
    "identity+rows", "ridgefill+rows", "ridgefill+random", "nofill+longtail",
)
SPLICE_ARMS = tuple(f"splice:{s}" for s in SPLICES)
CUT = "cut"  # loss only: the tail scored with the context cut to the tail itself

NEEDLE_ARMS = (EXACT, NOFILL, IDENTITY, RIDGEFILL, IDENTITY_ROWS, RIDGEFILL_ROWS, RIDGEFILL_RANDOM, NOFILL_LONGTAIL)
LOSS_ARMS = NEEDLE_ARMS + SPLICE_ARMS
ALL_ARMS = LOSS_ARMS + (CUT,)
ROWS_SHARE = 10  # percent of the prefix the rows arms select (SPEC.md, the reference "+ rows" arms)
ROWS_POLICY = "eval-rows"


def rows_policy_text(split: int, tail: int, share: int = ROWS_SHARE) -> str:
    """The server policy of an evaluation: attention top-k rows from the last 64 prompt tokens, summed over
    layers 3, 7, 11 and 15 where they lie below the split (the reference studies' choice), else layer S-1."""
    layers = [layer for layer in (3, 7, 11, 15) if layer < split] or [split - 1]
    return (
        f"# Written by sgl-ridgefill eval: the \"+ rows\" arms ({share} % of the prefix by attention).\n"
        f'policy "{ROWS_POLICY}" {{\n  arm ridgefill\n  split {split}\n  tail {tail}\n'
        f"  select attention_topk(q=64, share={share}%, layers=[{', '.join(map(str, layers))}])\n"
        f"  cache no_insert\n}}\n"
    )


def longtail_tail(config: Mapping[str, Any], length: int, split: int, tail: int) -> int:
    """The tail at which the no-fill arm costs what RidgeFill costs at ``tail`` (FLOP count, bench/bounds.py):
    the fill's multiply-adds spent on more exact tail rows instead."""
    dims = ModelDims.from_hf_config(config)
    target = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=split, tail=tail)).total
    lo, hi = tail, length
    while lo < hi:  # the no-fill cost grows with the tail; the smallest tail whose cost reaches the target
        mid = (lo + hi) // 2
        flops = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=split, tail=mid))
        if flops.total - flops.fill >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def arm_params(arm: str, *, split: int, tail: int, longtail: int | None = None, seed: int = 0) -> dict[str, Any]:
    """``custom_params`` for one request of ``arm``; ``seed`` draws the random control's rows."""
    base = {"split": split, "tail": tail}
    if arm in (EXACT, CUT):
        return {"ridgefill": {"arm": "exact"}}
    if arm in (NOFILL, IDENTITY, RIDGEFILL):
        return {"ridgefill": {**base, "arm": arm, "policy": "plain"}}
    if arm in (IDENTITY_ROWS, RIDGEFILL_ROWS):
        return {"ridgefill": {**base, "arm": arm.split("+")[0], "policy": ROWS_POLICY}}
    if arm == RIDGEFILL_RANDOM:
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": ROWS_POLICY, "control": "random", "seed": seed}}
    if arm == NOFILL_LONGTAIL:
        if longtail is None:
            raise ValueError("the nofill+longtail arm needs its tail (longtail_tail)")
        return {"ridgefill": {"split": split, "tail": longtail, "arm": NOFILL, "policy": "plain"}}
    if arm in SPLICE_ARMS:
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": "plain", "splice": arm.split(":")[1]}}
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ALL_ARMS)}")


def parse_arms(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``"all"`` or a comma-separated list of arm names (``exact`` is always included: everything is paired
    against it)."""
    if text == "all":
        return allowed
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arms if a not in allowed]
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(allowed)}")
    return tuple(dict.fromkeys((EXACT,) + arms))
