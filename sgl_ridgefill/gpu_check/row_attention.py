"""Row queries through SGLang's Triton extend kernel: what scattered rows cost next to exact attention.

One request of ``N`` tokens, every key visible, K/V already in a pool whose slot is the position. Each case
is planned by the runtime's planner (``steps.plan_steps`` and ``metadata``'s builders) and run by SGLang's
own ``extend_attention_fwd`` loaded by :mod:`.sgl_files`; its time is set against one causal extend of all
``N`` rows (exact prefill attention of one layer), so the ratio says what a RidgeFill upper layer's
attention costs relative to an exact one:

- ``exact``: all ``N`` rows as one causal extend (the yardstick);
- ``tail``: the last ``T`` rows;
- ``runs``: the tail and every 10th prefix row, one virtual request per row (a decode-like prefix read each);
- ``grouped G``: the same rows as the runtime runs them: prefix rows in groups of ``G`` under a mask
  ``key_pos <= q_pos`` built on the device, the tail as a plain causal extend in a launch of its own;
- ``windows``: the tail and ``window``-row windows covering 10 % of the prefix, as runs.

Each case's output is checked on sampled query rows against a float32 masked softmax.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from sgl_ridgefill.attention.metadata import triton_group_args, triton_run_args
from sgl_ridgefill.attention.planner import VirtualRequests, plan_virtual_requests
from sgl_ridgefill.attention.steps import plan_steps

from .check import Context, ModelShape, Row, Skip
from .kernel_steps import scattered_positions, window_positions
from .sgl_files import SglFilesMissing, load_extend_attention

# Worst |kernel - float32 reference| of an attention output (values are averages of N(0, 1) values).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def row_attention(ctx: Context) -> Iterator[Row]:
    if ctx.sgl_files is None:
        raise Skip("no --sgl-files folder given: SGLang's Triton attention was not measured")
    try:
        extend = load_extend_attention(ctx.sgl_files)
    except SglFilesMissing as missing:
        raise Skip(f"{missing}; SGLang's Triton attention was not measured") from None
    for model in ctx.sizes.attention_models:
        for n in ctx.sizes.contexts:
            ctx.check_time(f"row attention {model.name} N={n}")
            yield from _cases(ctx, extend.extend_attention_fwd, model, n)


def _case_plans(ctx: Context, n: int) -> list[tuple[str, torch.Tensor, int | None]]:
    """(label, positions, group size or None for runs only) of every case at context ``n``."""
    sizes = ctx.sizes
    tail = min(sizes.tail, n)
    scattered = scattered_positions(n, tail, sizes.every)
    cases = [
        ("exact", torch.arange(n), None),
        ("tail", torch.arange(n - tail, n), None),
        ("runs", scattered, None),
    ]
    cases += [(f"grouped G={g}", scattered, g) for g in sizes.group_sizes]
    cases.append((f"windows {sizes.window}", window_positions(n, tail, sizes.window, sizes.every), None))
    return cases


def _cases(ctx: Context, extend_attention_fwd: Callable, model: ModelShape, n: int) -> Iterator[Row]:
    pool = _Pool(ctx, model, n)
    exact_ms = None
    for label, positions, group in _case_plans(ctx, n):
        ctx.check_time(f"row attention {model.name} N={n} {label}")
        if group is None:
            parts = [(plan_virtual_requests(positions), torch.arange(positions.numel()))]
        else:
            (step,) = plan_steps(positions, chunk_rows=positions.numel(), group_size=group,
                                 runs_from=n - min(ctx.sizes.tail, n))
            cut = step.group_rows
            parts = [(step.groups, torch.arange(cut)), (step.runs, torch.arange(cut, positions.numel()))]
            parts = [(p, r) for p, r in parts if p is not None]
        launches = [pool.launch(extend_attention_fwd, part) for part, _ in parts]

        def run() -> None:
            for launch in launches:
                launch.run()

        run()  # the output checked below (and the first launch compiles the kernel)
        out = torch.empty(positions.numel(), model.heads, model.head_dim, device=ctx.device, dtype=ctx.dtype)
        for (_, rows), launch in zip(parts, launches):
            out[rows.to(ctx.device)] = launch.out
        err = pool.max_error(out, positions)
        ms = ctx.time_ms(run)
        exact_ms = ms if label == "exact" else exact_ms
        yield {
            "model": model.name, "context": n, "case": label, "rows": positions.numel(),
            "virtual_requests": sum(p.num_requests for p, _ in parts), "launches": len(launches), "ms": ms,
            "ratio_to_exact": ms / exact_ms if exact_ms else None,
            "max_abs_err": err, "ok": err <= TOLERANCE[ctx.dtype],
        }
        del launches, out


class _Launch:
    """One ``extend_attention_fwd`` call with its arguments prepared (planning is not timed here)."""

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, out: torch.Tensor) -> None:
        self.fn, self.args, self.kwargs, self.out = fn, args, kwargs, out

    def run(self) -> None:
        self.fn(*self.args, **self.kwargs)


class _Pool:
    """The request's K/V in a pool (slot = position) and a query for every position."""

    def __init__(self, ctx: Context, model: ModelShape, n: int) -> None:
        self.ctx, self.model = ctx, model
        self.k = ctx.randn(n, model.kv_heads, model.head_dim, seed=1)
        self.v = ctx.randn(n, model.kv_heads, model.head_dim, seed=2)
        self.q = ctx.randn(n, model.heads, model.head_dim, seed=3)
        self.slots = torch.arange(n, device=ctx.device)
        self.scale = model.head_dim**-0.5

    def launch(self, extend_attention_fwd: Callable, vr: VirtualRequests) -> _Launch:
        a = triton_group_args(vr, self.slots) if vr.has_groups else triton_run_args(vr, self.slots)
        rows = vr.positions.to(self.ctx.device)  # slot = position
        out = torch.empty(vr.num_rows, self.model.heads, self.model.head_dim, device=self.ctx.device, dtype=self.ctx.dtype)
        args = (
            self.q[rows].contiguous(), self.k[rows].contiguous(), self.v[rows].contiguous(), out, self.k, self.v,
            a.qo_indptr, a.kv_indptr, a.kv_indices, a.mask(), True, a.mask_indptr, a.max_extend_len, 1.0, 1.0,
        )
        kwargs = dict(
            sm_scale=self.scale, skip_prefix_custom_mask=a.skip_prefix_custom_mask, skip_extend=a.skip_extend,
            page_size=1, extend_seq_lens_cpu=vr.rows_per_request.tolist(),
        )
        return _Launch(extend_attention_fwd, args, kwargs, out)

    def max_error(self, out: torch.Tensor, positions: torch.Tensor) -> float:
        """Worst |out - float32 masked softmax| over up to ``check_rows`` rows: the last rows and a sample."""
        m = positions.numel()
        budget = min(self.ctx.sizes.check_rows, m)
        last = torch.arange(m - budget // 2, m)
        sample = torch.randperm(m - last.numel(), generator=torch.Generator().manual_seed(m))[: budget - last.numel()]
        picked = torch.cat([sample, last])
        want = self.reference(positions[picked])
        return float((out[picked.to(self.ctx.device)].float() - want).abs().max())

    def reference(self, positions: torch.Tensor, chunk: int = 128) -> torch.Tensor:
        """``[m, heads, head_dim]`` float32: query at ``p`` over the keys ``[0, p]``, ``chunk`` rows at a time."""
        model, dev = self.model, self.ctx.device
        kv, group, d = model.kv_heads, model.heads // model.kv_heads, model.head_dim
        outs = []
        for start in range(0, positions.numel(), chunk):
            pos = positions[start : start + chunk].to(dev)
            c, keys = pos.numel(), int(pos.max()) + 1
            q = self.q[pos].float().view(c, kv, group, d).permute(1, 2, 0, 3)  # [kv, group, c, d]
            k = self.k[:keys].float().permute(1, 2, 0)  # [kv, d, keys]
            v = self.v[:keys].float().permute(1, 0, 2)  # [kv, keys, d]
            s = torch.matmul(q, k[:, None]) * self.scale  # [kv, group, c, keys]
            hidden = torch.arange(keys, device=dev)[None, :] > pos[:, None]
            p = s.masked_fill_(hidden, float("-inf")).softmax(dim=-1)
            outs.append(torch.matmul(p, v[:, None]).permute(2, 0, 1, 3).reshape(c, model.heads, d))
        return torch.cat(outs)
