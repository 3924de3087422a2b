"""``policy explain``: what a compiled policy costs and does at a given prompt length.

Compute fraction (equal cost per layer per token, maps free): ``r = S/L + (1 - S/L) * T/N`` with the
tail capped at N; exact prefix rows add ``(1 - S/L) * E/N`` for ``E`` expected rows; the speed bound is
``1/r``. Attention grows with N^2 and maps, selectors and corrections cost something, so measured
speedups land below this bound (the seeds report 72-92 % of a FLOP-counted bound).
"""

from __future__ import annotations

import dataclasses

from sgl_ridgefill.selectors.spec import BoundSelector

from . import ast
from .compiler import CompiledPolicy
from .formatter import format_budget, format_expr
from .manifest import MapsFacts

_CORRECTION_TEXT = {
    "value_rescale": "the first {c} tail rows measure, per KV head of every upper attention layer, the ratio of "
    "exact to predicted value norms; filled values are scaled by it",
    "terminal_state": "at the end of the prefix, rho_l * dM_l (offsets from {offsets}) is added once to each filled "
    "recurrent layer's state",
}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The numbers ``policy explain`` prints for one prompt length."""

    tokens: int
    num_layers: int
    split: int
    prefix_rows: int
    tail_rows: int
    r: float
    exact_rows: float
    rows_share: float
    map_bytes: int | None
    map_quant: str | None

    @property
    def r_total(self) -> float:
        return self.r + self.rows_share

    @property
    def bound(self) -> float:
        return 1.0 / self.r

    @property
    def bound_total(self) -> float:
        return 1.0 / self.r_total


def explain_policy(policy: CompiledPolicy, *, tokens: int, num_layers: int, maps: MapsFacts | None = None) -> Explanation:
    """Cost of ``policy`` for an ``tokens``-token prompt on a ``num_layers``-layer model."""
    if tokens < 1:
        raise ValueError(f"explain: --tokens must be at least 1, got {tokens}")
    if num_layers < 1:
        raise ValueError(f"explain: the model must have at least 1 layer, got {num_layers}")
    split = num_layers if policy.arm == "exact" else min(policy.split_for(tokens), num_layers)
    tail = min(policy.tail, tokens)
    prefix = tokens - tail
    kept = split / num_layers
    r = kept + (1.0 - kept) * tail / tokens
    exact = policy.selection.expected_rows(prefix) if policy.selection is not None else 0.0
    rows_share = (1.0 - kept) * exact / tokens
    map_bytes = quant = None
    if maps is not None and policy.arm == "ridgefill" and split < num_layers:
        found = maps.map_bytes(split)
        if found is not None:
            map_bytes, quant = found
    return Explanation(tokens, num_layers, split, prefix, tail, r, exact, rows_share, map_bytes, quant)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _selector_line(selector: BoundSelector) -> str:
    args = []
    for key, value in selector.args:
        param = selector.spec.param(key)
        if value is None:
            continue
        if param is not None and param.kind == "share":
            args.append(f"{key}={value * 100:g}%")
        elif isinstance(value, tuple):
            args.append(f"{key}=[{', '.join(str(v) for v in value)}]")
        elif isinstance(value, bool):
            args.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, str):
            args.append(f'{key}="{value}"')
        else:
            args.append(f"{key}={value}")
    return f"{selector.spec.name}({', '.join(args)}): {selector.spec.summary}"


def render_explanation(policy: CompiledPolicy, e: Explanation) -> str:
    """The text ``policy explain`` prints."""
    out = [
        f'policy "{policy.name}" (identity {policy.identity})',
        f"  arm {policy.arm}, split {e.split} of {e.num_layers} layers, tail {policy.tail}, cache {policy.cache_mode}",
        f"prompt of {e.tokens} tokens: {e.prefix_rows} prefix rows, {e.tail_rows} tail rows",
        "",
        "compute (equal cost per layer and token, maps free; attention grows with N^2, so real speedups land lower):",
    ]
    if policy.arm == "exact":
        out.append("  arm exact runs every layer for every row: r = 1.0000, bound 1.00x")
    else:
        kept = e.split / e.num_layers
        out.append(
            f"  r = S/L + (1 - S/L)*T/N = {kept:.4f} + {1 - kept:.4f} * {e.tail_rows / e.tokens:.4f} = {e.r:.4f}"
            f"   bound 1/r = {e.bound:.2f}x"
        )
    if policy.selection is not None:
        share = e.exact_rows / e.prefix_rows if e.prefix_rows else 0.0
        out.append(
            f"  exact prefix rows: about {e.exact_rows:.0f} of {e.prefix_rows} ({share:.1%}; an estimate from typical "
            "selector sizes, assuming independent selectors)"
        )
        out.append(f"    add (1 - S/L)*E/N = {e.rows_share:.4f}")
        out.append(f"  with exact rows: r = {e.r_total:.4f}   bound {e.bound_total:.2f}x")
    if e.map_bytes is not None:
        out.append(
            f"maps: {e.num_layers - e.split} upper layers, {_size(e.map_bytes)} stored as {e.map_quant} "
            "(resident in accelerator memory, or streamed one layer at a time)"
        )
    elif policy.arm == "ridgefill":
        out.append("maps: size unknown (pass --maps DIR to read it from the manifest)")
    if policy.selection is not None:
        plan_ast = next(s for s in policy.source.statements if isinstance(s, ast.SelectStmt))
        out += ["", "selection:", f"  select {format_expr(plan_ast.rows)}"]
        out += [f"    budget {format_budget(b)}" for b in plan_ast.budgets]
        out += [f"    reserve {format_expr(r.rows)} up to {format_budget(r.limit)}" for r in plan_ast.reserves]
        out += [f"    plus {format_expr(p)}" for p in plan_ast.plus]
        out.append("  selectors:")
        out += [f"    {_selector_line(s)}" for s in policy.selection.selectors()]
        if policy.requirements:
            out.append("  computed by the runtime before selecting:")
            out += [f"    {req.describe()}" for req in policy.requirements]
    fixes = []
    if policy.value_rescale_c is not None:
        fixes.append(f"value_rescale(c={policy.value_rescale_c}): " + _CORRECTION_TEXT["value_rescale"].format(c=policy.value_rescale_c))
    if policy.terminal_state is not None:
        fixes.append(
            f'terminal_state(offsets="{policy.terminal_state.offsets}"): '
            + _CORRECTION_TEXT["terminal_state"].format(offsets=policy.terminal_state.offsets)
        )
    if fixes:
        out += ["", "corrections:"] + [f"  {f}" for f in fixes]
    if policy.warnings:
        out += [""] + [f"warning: {w}" for w in policy.warnings]
    return "\n".join(out) + "\n"
