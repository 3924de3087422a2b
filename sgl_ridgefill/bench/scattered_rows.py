"""Side-by-side timing of the CPU backend's attention for a selection's scattered rows.

``python -m sgl_ridgefill.bench.scattered_rows [--lengths 6144,16384] [--tail 1024] [--share 0.1] [--window 17]``
prints, per dtype and prompt length, the best time of two ways to attend the same rows, alternating them, and
their ratio: *masked*, blocks of 512 rows over the keys up to each block's last position under one causal mask;
*backend*, what ``ridgefill_cpu`` runs for rows that are not one run (``attention/cpu.py``), the same in
blocks of its ``QUERY_BLOCK`` rows. The rows are what a pooled attention selection chooses: ``share`` of
the prefix in windows of ``window`` consecutive rows at random places. Heads are Qwen2.5-0.5B's (14 query, 2 KV, 64 wide).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from types import SimpleNamespace

import torch

from ..attention.cpu import RidgeFillCpuAttnBackend
from ..tools import args as argtypes
from .tail_attention import HEAD_DIM, HEADS, KV_HEADS, masked_rows as masked

WIDE_BLOCK = 512


def backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """The same rows through ``ridgefill_cpu``'s path for scattered rows, over a pool that holds ``k``/``v`` in
    position order: ``[1, heads, n, d]``."""
    attn = RidgeFillCpuAttnBackend.__new__(RidgeFillCpuAttnBackend)  # only its pool is read
    keys, values = k[0].movedim(0, 1), v[0].movedim(0, 1)  # [N, kv_heads, d]
    attn.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda layer_id: keys,
                                            get_value_buffer=lambda layer_id: values)
    layer = SimpleNamespace(tp_q_head_num=q.shape[1], tp_k_head_num=k.shape[1], layer_id=0, scaling=scale)
    rows = q[0].movedim(0, 1)  # [n, heads, d]
    out = torch.empty_like(rows)
    attn._attend_masked(rows, out, torch.arange(k.shape[2]), positions, positions.tolist(), None, layer)
    return out.movedim(0, 1).unsqueeze(0)


def scattered_positions(prefix: int, share: float, window: int, gen: torch.Generator) -> torch.Tensor:
    """``share`` of ``prefix`` rows in windows of ``window`` consecutive rows, ascending, without overlap."""
    windows = max(1, round(share * prefix / window))
    starts = torch.randperm(prefix // window, generator=gen)[:windows].sort().values * window
    return (starts[:, None] + torch.arange(window)[None, :]).flatten()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argtypes.command_parser("sgl_ridgefill.bench.scattered_rows", __doc__)
    parser.add_argument("--lengths", type=argtypes.token_counts, default=(6144, 16384))
    parser.add_argument("--tail", type=int, default=1024)
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", type=argtypes.choices(("float32", "bfloat16", "float16"), what="dtype"),
                        default=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    if not 0 < args.share <= 1 or args.window < 1 or args.tail < 0:
        parser.error("--share must be in (0, 1], --window at least 1 and --tail at least 0")
    gen = torch.Generator().manual_seed(0)
    scale = HEAD_DIM**-0.5
    print(json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))
    arms = {"masked": lambda q, k, v, pos: masked(q, k, v, pos, WIDE_BLOCK, scale),
            "backend": lambda q, k, v, pos: backend(q, k, v, pos, scale)}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for n in args.lengths:
            prefix = n - args.tail
            if prefix < args.window:
                parser.error(f"--lengths {n} leaves a prefix of {prefix} rows, shorter than one window")
            positions = scattered_positions(prefix, args.share, args.window, gen)
            q = torch.randn(1, HEADS, positions.numel(), HEAD_DIM, generator=gen).to(dtype)
            k = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            v = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            outs = [fn(q, k, v, positions).float() for fn in arms.values()]
            err = (outs[0] - outs[1]).abs().max().item()
            times: dict[str, list[float]] = {name: [] for name in arms}
            for _ in range(args.repeats):
                for name, fn in arms.items():
                    t0 = time.perf_counter()
                    fn(q, k, v, positions)
                    times[name].append(time.perf_counter() - t0)
            best = {name: min(ts) for name, ts in times.items()}
            print(json.dumps({"dtype": dtype_name, "length": n, "rows": positions.numel(),
                              "masked_s": round(best["masked"], 6), "backend_s": round(best["backend"], 6),
                              "ratio": round(best["masked"] / best["backend"], 3), "max_abs_diff": err}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
