"""``probe``: rank the prefix by the attention the prompt's last rows give it through the exact upper layers.

Sub-split attention only sees how the lower layers route; the probe asks the layers that were filled.
The runtime runs the last ``rows`` prompt rows through the exact upper layers once over the filled
cache (Qwen3.8-27B: 256 rows, about 1.6 % of upper-layer rows at 16K) and records the attention they
give every prefix row; this selector only ranks that statistic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .base import ProbeRequirement, SelectionInputs
from .rows import rank_by_score
from .spec import ArgumentError, BindContext, Param, SelectorSpec


def probe(inputs: SelectionInputs, *, rows: int) -> torch.Tensor:
    """Every prefix row, ranked by the attention the last `rows` prompt rows give it in the exact upper layers.

    The last `rows` rows run the exact upper layers once over the filled cache; attention is summed over
    heads, probe rows and upper attention layers. It ranks the whole prefix, so it needs a budget
    (`budget ...` or `top(probe(), ...)`). Returns ranked rows, most attended first: [prefix_len] int64.
    """
    return rank_by_score(inputs.statistic(ProbeRequirement(rows), "probe"))


def _resolve(args: dict[str, Any], ctx: BindContext) -> dict[str, Any]:
    if ctx.arm not in ("ridgefill", "identity"):
        raise ArgumentError(f"probe() reads a filled cache, and arm {ctx.arm} fills nothing", None)
    if ctx.split is not None and ctx.num_layers is not None and ctx.split >= ctx.num_layers:
        raise ArgumentError(f"probe(): split {ctx.split} leaves no upper layer to probe", None)
    return args


def _requirements(args: Mapping[str, Any]) -> tuple[ProbeRequirement, ...]:
    return (ProbeRequirement(args["rows"]),)


SPEC = SelectorSpec(
    name="probe",
    fn=probe,
    params=(Param("rows", "int", "last prompt rows that probe the filled cache", default=256, minimum=1, maximum=1 << 20),),
    resolve=_resolve,
    requirements=_requirements,
    ranks_all=True,
    expected_rows=lambda args, n: n,
)
