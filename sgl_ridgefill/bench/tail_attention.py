"""Side-by-side timing of the CPU backend's two ways to attend a run of tail rows after a prefix.

``python -m sgl_ridgefill.bench.tail_attention [--lengths 8192,16384] [--tail 1024] [--repeats 5]`` prints,
per dtype and prompt length, the best time of each and their ratio, alternating the two: *masked*, the
rows in query blocks of the backend's ``QUERY_BLOCK`` rows over the keys up to each block with a causal mask
offset by the prefix (what ``ridgefill_cpu`` runs for rows that are not one run); *split*
(what ``ridgefill_cpu`` runs, ``attention/cpu.py``), a causal call over the rows' own keys merged by
log-sum-exp with an unmasked call over the prefix. Heads are Qwen2.5-0.5B's (14 query, 2 KV, 64 wide).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import torch
from torch.nn.functional import scaled_dot_product_attention

from ..attention.cpu import QUERY_BLOCK, _flash
from ..tools import args as argtypes

HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64


def masked_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, block: int,
                scale: float) -> torch.Tensor:
    """``q``: ``[1, heads, n, d]`` at ``positions`` (ascending), ``k``/``v``: ``[1, kv_heads, N, d]``: each block
    of ``block`` rows over the keys up to its last position, causally masked."""
    out = []
    n = q.shape[2]
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        kv_len = int(positions[hi - 1]) + 1
        mask = torch.arange(kv_len)[None, :] <= positions[lo:hi, None]
        out.append(scaled_dot_product_attention(q[:, :, lo:hi], k[:, :, :kv_len], v[:, :, :kv_len], attn_mask=mask,
                                                scale=scale, enable_gqa=True))
    return torch.cat(out, 2)


def masked(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    return masked_rows(q, k, v, torch.arange(prefix, prefix + q.shape[2]), QUERY_BLOCK, scale)


def split(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    diag, lse_diag = _flash(q, k[:, :, prefix:], v[:, :, prefix:], causal=True, scale=scale)
    before, lse_before = _flash(q, k[:, :, :prefix], v[:, :, :prefix], causal=False, scale=scale)
    w = torch.sigmoid(lse_before - lse_diag).unsqueeze(-1)
    return (diag.float() + w * (before.float() - diag.float())).to(q.dtype)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argtypes.command_parser("sgl_ridgefill.bench.tail_attention", __doc__)
    parser.add_argument("--lengths", type=argtypes.token_counts, default=(8192, 16384))
    parser.add_argument("--tail", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", type=argtypes.choices(("float32", "bfloat16", "float16"), what="dtype"),
                        default=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    scale = HEAD_DIM**-0.5
    print(json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for n in args.lengths:
            prefix = n - args.tail
            q = torch.randn(1, HEADS, args.tail, HEAD_DIM, generator=gen).to(dtype)
            k = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            v = torch.randn(1, KV_HEADS, n, HEAD_DIM, generator=gen).to(dtype)
            err = (masked(q, k, v, prefix, scale).float() - split(q, k, v, prefix, scale).float()).abs().max().item()
            times: dict[str, list[float]] = {"masked": [], "split": []}
            for _ in range(args.repeats):
                for name, fn in (("masked", masked), ("split", split)):
                    t0 = time.perf_counter()
                    fn(q, k, v, prefix, scale)
                    times[name].append(time.perf_counter() - t0)
            best = {name: min(ts) for name, ts in times.items()}
            print(json.dumps({"dtype": dtype_name, "length": n, "tail": args.tail, "masked_s": round(best["masked"], 4),
                              "split_s": round(best["split"], 4), "ratio": round(best["masked"] / best["split"], 3),
                              "max_abs_diff": err}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
