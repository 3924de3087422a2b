"""The kernels tier's own steps: maps (float and int8), attention statistics, the fill, the planner.

Every step compares what it times with a float32 (or float64) reference where there is one, and reports
the measured map backend choice of :mod:`sgl_ridgefill.kernels.choose`, so one run says both how fast each
path is and which one the runtime would pick on this GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from sgl_ridgefill.attention.metadata import RUN_ARGS, step_args
from sgl_ridgefill.attention.steps import plan_steps
from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.kernels.attention_stats import attention_received, attention_received_reference
from sgl_ridgefill.kernels.choose import TOLERANCE, fastest_map_backend
from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8, apply_map_reference
from sgl_ridgefill.kernels.quant import dequantize_int8_groupwise, quantize_int8_groupwise
from sgl_ridgefill.maps.kinds import map_kind

from .check import Context, ModelShape, Row

MAP_BACKENDS = ("torch", "triton")
# Attention statistics sum probabilities; their float32 accumulation order differs between the two paths.
STATS_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def maps(ctx: Context) -> Iterator[Row]:
    """``[rows, d] · Aᵀ + b`` per map backend: time, TFLOP/s, fraction of peak, error against float32."""
    yield from _maps(ctx, int8=False)


def maps_int8(ctx: Context) -> Iterator[Row]:
    """The same for group-wise int8 maps (Triton dequantises in registers, torch dequantises then cuBLAS)."""
    yield from _maps(ctx, int8=True)


def _maps(ctx: Context, *, int8: bool) -> Iterator[Row]:
    group = ctx.sizes.int8_group if int8 else None
    for model in ctx.sizes.map_models:
        d = model.hidden
        ctx.check_time(f"maps d={d}")
        a = ctx.randn(d, d, seed=d, scale=d**-0.5).float()
        b = ctx.randn(d, seed=d + 1).float()
        if int8:
            q, scale = quantize_int8_groupwise(a, group)
            a_ref = dequantize_int8_groupwise(q, scale, group, dtype=torch.float32)
            b_x = b.to(ctx.dtype)
            call = {name: (lambda x, name=name: apply_map_int8(x, q, scale, b_x, group, backend=name)) for name in MAP_BACKENDS}
        else:
            a_x, b_x = a.to(ctx.dtype), b.to(ctx.dtype)
            a_ref = a_x.float()
            call = {name: (lambda x, name=name: apply_map(x, a_x, b_x, backend=name)) for name in MAP_BACKENDS}
        map_dtype = torch.int8 if int8 else ctx.dtype
        choice = fastest_map_backend(map_dtype, d, d, device=ctx.device, x_dtype=ctx.dtype, group_size=group)
        yield {"model": model.name, "d": d, "runtime_choice": choice.backend, "choice_ms": _plain(choice.ms),
               "choice_failed": dict(choice.failed)}
        for rows in ctx.sizes.map_rows:
            ctx.check_time(f"maps d={d} rows={rows}")
            x = ctx.randn(rows, d, seed=rows)
            want = apply_map_reference(x.float(), a_ref, b_x.float())
            for name, fn in call.items():
                err = _rel_err(fn(x), want)
                ms = ctx.time_ms(lambda fn=fn: fn(x))
                yield {"d": d, "rows": rows, "backend": name, "ms": ms, **ctx.tflops(2.0 * rows * d * d, ms),
                       "max_rel_err": err, "ok": err <= TOLERANCE[ctx.dtype]}
            del x, want
        del a, a_ref


def attention_stats(ctx: Context) -> Iterator[Row]:
    """Attention each key receives from the last ``stats_queries`` rows: Triton against the reference."""
    n_q = ctx.sizes.stats_queries
    for model in ctx.sizes.attention_models:
        for n_k in ctx.sizes.stats_keys:
            ctx.check_time(f"attention statistics {model.name} n_k={n_k}")
            q = ctx.randn(n_q, model.heads, model.head_dim, seed=n_k)
            k = ctx.randn(n_k, model.kv_heads, model.head_dim, seed=n_k + 1)
            k_pos = torch.arange(n_k, device=ctx.device)
            q_pos = k_pos[-n_q:]
            scale = model.head_dim**-0.5
            want = attention_received_reference(q, k, q_pos, k_pos, scale)
            got = attention_received(q, k, q_pos, k_pos, scale, backend="triton")
            err = _rel_err(got, want)
            flops = 4.0 * n_q * model.heads * n_k * model.head_dim
            for name in ("triton", "reference"):
                ms = ctx.time_ms(lambda name=name: attention_received(q, k, q_pos, k_pos, scale, backend=name))
                row = {"model": model.name, "n_q": n_q, "n_k": n_k, "backend": name, "ms": ms, **ctx.tflops(flops, ms)}
                if name == "triton":
                    row.update(max_rel_err=err, ok=err <= STATS_TOLERANCE[ctx.dtype])
                yield row


def fill(ctx: Context) -> Iterator[Row]:
    """The fill of one upper layer per row: the map (runtime's choice of backend), then the runtime's K/V path
    (``ModelAdapter.key_value``: input norm, one GEMM over the K/V rows, RoPE on K), here in plain torch since
    SGLang is absent; beside it the linear layers of one exact layer on the same rows, and the FLOP ratio."""
    rows = ctx.sizes.fill_rows
    for model in ctx.sizes.fill_models:
        ctx.check_time(f"fill {model.name}")
        d, kv = model.hidden, model.kv_size
        backend = fastest_map_backend(ctx.dtype, d, d, device=ctx.device, x_dtype=ctx.dtype).backend
        a, b = ctx.randn(d, d, seed=1, scale=d**-0.5), ctx.randn(d, seed=2)
        norm_w = 1 + ctx.randn(d, seed=3, scale=0.1)
        w_kv, b_kv = ctx.randn(2 * kv, d, seed=4, scale=d**-0.5), ctx.randn(2 * kv, seed=5)
        x = ctx.randn(rows, d, seed=6)
        positions = torch.arange(rows, device=ctx.device)
        cos, sin = _rope_cache(positions, model.head_dim, ctx.device)

        def key_value(x_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = _rms_norm(x_hat, norm_w, 1e-6)
            k, v = F.linear(h, w_kv, b_kv).split([kv, kv], dim=-1)
            return _rope_neox(k.reshape(rows, model.kv_heads, model.head_dim), cos, sin), v

        def one_fill():
            return key_value(apply_map(x, a, b, backend=backend))

        map_ms = ctx.time_ms(lambda: apply_map(x, a, b, backend=backend))
        kv_ms = ctx.time_ms(lambda: key_value(x))
        fill_ms = ctx.time_ms(one_fill)
        layer_ms = _exact_layer_linear_ms(ctx, model, x)
        dims = ModelDims(num_layers=1, hidden_size=d, num_heads=model.heads, num_kv_heads=model.kv_heads,
                         head_dim=model.head_dim, intermediate_size=model.ffn, vocab_size=2)
        fill_flops = map_kind(None).fill_flops(d, kv)  # the residual map, then K/V
        per_row = 1e6 / rows  # ms over rows -> ns per row
        yield {
            "model": model.name, "rows": rows, "map_backend": backend,
            "map_ns_per_row": map_ms * per_row, "key_value_ns_per_row": kv_ms * per_row,
            "fill_ns_per_row": fill_ms * per_row, "exact_layer_linear_ns_per_row": layer_ms * per_row,
            "fill_over_layer_time": fill_ms / layer_ms, "fill_over_layer_flops": fill_flops / (2 * dims.layer_params),
        }
        del a, w_kv, x


def _exact_layer_linear_ms(ctx: Context, model: ModelShape, x: torch.Tensor) -> float:
    """One exact layer's projections and MLP (QKV, O, gate-up, SiLU-and-mul, down) on ``x``'s rows."""
    d, q_size = model.hidden, model.heads * model.head_dim
    w_qkv = ctx.randn(q_size + 2 * model.kv_size, d, seed=7, scale=d**-0.5)
    w_o = ctx.randn(d, q_size, seed=8, scale=q_size**-0.5)
    w_gate_up = ctx.randn(2 * model.ffn, d, seed=9, scale=d**-0.5)
    w_down = ctx.randn(d, model.ffn, seed=10, scale=model.ffn**-0.5)

    def layer() -> torch.Tensor:
        attn_out = F.linear(F.linear(x, w_qkv)[:, :q_size], w_o)
        gate, up = F.linear(attn_out, w_gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w_down)

    return ctx.time_ms(layer)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SGLang's ``RMSNorm.forward_native`` rounding: float32, rounded once (its CUDA path is one fused kernel)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _rope_cache(positions: torch.Tensor, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]  # [rows, head_dim / 2]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def _rope_neox(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``k: [rows, kv_heads, head_dim]`` rotated in halves (Llama/Qwen's neox layout), in float32."""
    k1, k2 = k.float().chunk(2, dim=-1)
    return torch.cat([k1 * cos - k2 * sin, k2 * cos + k1 * sin], dim=-1).to(k.dtype)


def planner(ctx: Context) -> Iterator[Row]:
    """Host planning plus each backend's metadata for the tail and every 10th prefix row at the largest
    context, as the runtime prepares an upper pass (groups of the prefix rows, the tail as runs), with the
    request's slots on the device (a shuffled pool). One host thread, as SGLang's scheduler runs on CUDA."""
    n, tail = max(ctx.sizes.contexts), ctx.sizes.tail
    positions = scattered_positions(n, tail, ctx.sizes.every)
    slots = torch.randperm(n, generator=ctx.generator(0), device=ctx.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for group in ctx.sizes.group_sizes:
            for backend in RUN_ARGS:
                ctx.check_time(f"planner G={group} {backend}")

                def prepare(group=group, backend=backend):
                    steps = plan_steps(positions, chunk_rows=n, group_size=group, runs_from=n - tail)
                    return steps, [step_args(backend, s, slots) for s in steps]

                ms = ctx.time_ms(prepare, wall=True)
                steps, args = prepare()
                yield {"context": n, "rows": positions.numel(), "group_size": group, "backend": backend,
                       "steps": len(steps), "virtual_requests": sum(s.num_requests for s in steps),
                       "host_ms": ms, "metadata_mib": sum(_tensor_mib(a) for pair in args for a in pair if a)}
                del args
    finally:
        torch.set_num_threads(threads)


def host_path(ctx: Context) -> Iterator[Row]:
    """The host side of one request's selection and upper passes at the Llama-3.1-8B shape, 16K tokens,
    T = 4,096, on one thread, per backend and selection (``estimates.host_side``: the runtime's own steps,
    staging and metadata builders). On CUDA the device tensors are real and ``torch.cuda.set_sync_debug_mode``
    counts every real host sync; off CUDA they are meta tensors (a data-dependent op raises there)."""
    import warnings

    from .estimates import BACKENDS, Case, host_side, select

    device = "cuda" if ctx.device.type == "cuda" else "meta"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for selection in ("no rows", "10% pooled attention", "probe policy (~30%)"):
            for backend in BACKENDS:
                case = Case("llama-3.1-8b", 16384, 4096, selection, backend)
                ctx.check_time(f"host path {selection} {backend}")
                exact = select(case)
                host_side(case, exact, repeats=1, device=device)  # first use (allocator, caches)
                row = host_side(case, exact, device=device)  # timed
                row.pop("passes")
                real = None
                if device == "cuda":
                    torch.cuda.synchronize()
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        torch.cuda.set_sync_debug_mode("warn")
                        try:
                            host_side(case, exact, repeats=1, device=device)
                        finally:
                            torch.cuda.set_sync_debug_mode("default")
                    real = sum("synchroniz" in str(w.message) for w in caught)
                yield {"selection": selection, "backend": backend, "device": device,
                       "exact_rows": int(exact.numel()), **row, "cuda_syncs": real}
    finally:
        torch.set_num_threads(threads)


def scattered_positions(n: int, tail: int, every: int) -> torch.Tensor:
    """[m] int64 CPU: every ``every``-th prefix row, then the tail ``[n - tail, n)``."""
    return torch.cat([torch.arange(0, n - tail, every), torch.arange(n - tail, n)])


def window_positions(n: int, tail: int, window: int, every: int) -> torch.Tensor:
    """[m] int64 CPU: ``window``-row windows covering 1/``every`` of the prefix, then the tail."""
    starts = torch.arange(0, n - tail - window + 1, window * every)
    rows = (starts[:, None] + torch.arange(window)[None, :]).flatten()
    return torch.cat([rows, torch.arange(n - tail, n)])


def _tensor_mib(args: object) -> float:
    tensors = [v for v in vars(args).values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20


def _plain(ms: object) -> dict:
    return {name: {str(rows): t for rows, t in by_rows.items()} for name, by_rows in dict(ms).items()}
