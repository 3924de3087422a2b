"""Micro-benchmark of the kernels: ``python -m sgl_ridgefill.kernels.bench [--help]``.

Times the map application (bf16 and int8 maps) and the attention statistics: on CPU their PyTorch
references, on CUDA the Triton kernels against ``torch.addmm`` (the maps' candidates of
:mod:`sgl_ridgefill.kernels.choose`) and the attention reference; prints achieved GFLOP/s and, on CUDA, the
fraction of the device's dense bf16 matrix throughput. ``--int8-error`` also reports how far the group-wise
int8 maps of :mod:`sgl_ridgefill.kernels.quant` are from the float maps.

CPU defaults are small (a few hundred rows) so the whole run takes well under a minute on two cores;
``--rows 8192 16384`` gives the sizes of the project's GPU issue. ``python -m sgl_ridgefill.gpu_check``
is the fuller GPU check (errors, the planner, SGLang's attention kernel, a JSON report).
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch

from sgl_ridgefill.kernels.attention_stats import attention_received
from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8
from sgl_ridgefill.kernels.quant import DEFAULT_GROUP_SIZE, dequantize_int8_groupwise, quantize_int8_groupwise
from sgl_ridgefill.kernels.timing import median_ms

# Dense bf16 tensor-core peak (no sparsity), TFLOP/s, by a substring of the device name.
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


def _seconds(device: torch.device, repeat: int, fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    """Median time of ``repeat`` calls of ``fn(*args, **kwargs)`` after one warm-up (which also compiles
    Triton kernels)."""
    return median_ms(lambda: fn(*args, **kwargs), device=device, warmup=1, repeats=repeat) / 1e3


def _peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def _report(label: str, flops: float, seconds: float, peak: float | None, half: bool) -> None:
    gflops = flops / seconds / 1e9
    line = f"{label:<58} {seconds * 1e3:9.2f} ms {gflops:10.4g} GFLOP/s"
    if peak is not None and half:
        line += f"   {gflops / 1e3 / peak:6.1%} of {peak:.0f} TFLOP/s bf16"
    print(line, flush=True)


def bench_maps(args: argparse.Namespace, device: torch.device, backends: list[str], peak: float | None) -> None:
    """``x_split: [rows, d] · Aᵀ`` for one upper layer, float and int8 maps."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    for d in args.dims:
        A = (torch.randn(d, d, generator=gen) / d**0.5).to(device)
        q, scale = quantize_int8_groupwise(A, DEFAULT_GROUP_SIZE)
        b = torch.randn(d, generator=gen).to(device)
        for rows in args.rows:
            x = torch.randn(rows, d, generator=gen).to(device)
            flops = 2.0 * rows * d * d
            for backend in backends:
                for dtype in args.dtypes:
                    xd, Ad, bd = x.to(dtype), A.to(dtype), b.to(dtype)
                    t = _seconds(device, args.repeat, apply_map, xd, Ad, bd, backend=backend)
                    _report(f"map {backend:<9} {dtype} rows={rows} d={d}", flops, t, peak, dtype != torch.float32)
                xb = x.to(torch.bfloat16)
                t = _seconds(device, args.repeat, apply_map_int8, xb, q, scale, b, DEFAULT_GROUP_SIZE, backend=backend)
                _report(f"map-int8 {backend:<9} bf16 x rows={rows} d={d}", flops, t, peak, True)


def bench_attention(args: argparse.Namespace, device: torch.device, backends: list[str], peak: float | None) -> None:
    """Attention received from the last ``--queries`` rows over ``rows`` keys, 32 query / 8 KV heads of 128."""
    gen = torch.Generator(device="cpu").manual_seed(2)
    heads, n_kv, head_dim = 32, 8, 128
    for n_k in args.rows:
        n_q = min(args.queries, n_k)
        q = torch.randn(n_q, heads, head_dim, generator=gen).to(device, torch.bfloat16)
        k = torch.randn(n_k, n_kv, head_dim, generator=gen).to(device, torch.bfloat16)
        k_pos = torch.arange(n_k, device=device)
        q_pos = k_pos[-n_q:]
        # Both passes compute the q·kᵀ scores: 2 x 2 x n_q x heads x n_k x head_dim.
        flops = 4.0 * n_q * heads * n_k * head_dim
        for backend in backends:
            t = _seconds(device, args.repeat, attention_received, q, k, q_pos, k_pos, head_dim**-0.5, backend=backend)
            _report(f"attention-received {backend:<9} bf16 n_q={n_q} n_k={n_k}", flops, t, peak, True)


def int8_error(d: int, seed: int = 0, rows: int = 256, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, float]:
    """Errors of the int8 group-wise map against the float map, for ``A: [d, d]`` standard Gaussian.

    ``element_vs_group_max``: worst ``|Â - A|`` over the largest ``|A|`` of its group (the rounding bound
    is 1/254); ``matrix_fro``: ``‖Â - A‖_F / ‖A‖_F``; ``output_row_worst``: worst over ``rows`` Gaussian
    rows ``x`` of ``‖x(Â - A)ᵀ‖ / ‖xAᵀ‖``.
    """
    gen = torch.Generator().manual_seed(seed)
    # float32, as a fitted map is stored before quantisation; errors are measured in float64.
    A = torch.randn(d, d, generator=gen).double()
    q, scale = quantize_int8_groupwise(A, group_size)
    err = dequantize_int8_groupwise(q, scale, group_size, dtype=torch.float64) - A
    group_max = scale.double().repeat_interleave(group_size, dim=1)[:, :d] * 127.0
    x = torch.randn(rows, d, generator=gen, dtype=torch.float64)
    row_err = torch.linalg.vector_norm(x @ err.T, dim=1) / torch.linalg.vector_norm(x @ A.T, dim=1)
    return {
        "element_vs_group_max": float((err.abs() / group_max).max()),
        "matrix_fro": float(torch.linalg.matrix_norm(err) / torch.linalg.matrix_norm(A)),
        "output_row_worst": float(row_err.max()),
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sgl_ridgefill.kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", help="row counts (default: 256 512 on CPU, 8192 16384 on CUDA)")
    parser.add_argument("--dims", type=int, nargs="+", default=[896, 4096], help="hidden sizes d (default: 896 4096)")
    parser.add_argument("--queries", type=int, default=64, help="query rows of the attention statistics (default: 64)")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per case, best kept (default: 3)")
    parser.add_argument("--only", choices=["maps", "attention"], nargs="+", help="run only these parts")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak of the device, if not in the built-in table")
    parser.add_argument("--int8-error", action="store_true", help="also report int8 map errors at each --dims size")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.rows is None:
        args.rows = [8192, 16384] if device.type == "cuda" else [256, 512]
    # On CPU the float32 reference is the only path that is not an upcast copy of it.
    args.dtypes = [torch.bfloat16, torch.float32] if device.type == "cuda" else [torch.float32, torch.bfloat16]
    return args


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    peak = _peak_tflops(device, args.peak_tflops)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; rows {args.rows}; d {args.dims}; best of {args.repeat}", flush=True)
    parts = args.only or ["maps", "attention"]
    if "maps" in parts:
        bench_maps(args, device, ["torch", "triton"] if on_cuda else ["reference"], peak)
    if "attention" in parts:
        bench_attention(args, device, ["reference", "triton"] if on_cuda else ["reference"], peak)
    if args.int8_error:
        for d in args.dims:
            errors = int8_error(d)
            listed = ", ".join(f"{name}={value:.3e}" for name, value in errors.items())
            print(f"int8 map error d={d}x{d} group={DEFAULT_GROUP_SIZE}: {listed}")


if __name__ == "__main__":
    main()
