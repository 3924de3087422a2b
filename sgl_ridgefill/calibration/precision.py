"""What float32 block products cost the statistics, against float64: held-out R^2 and the maps.

    python -m sgl_ridgefill.calibration.precision --model qwen2.5-coder-0.5b --splits 12 \
        --max-tokens 40000 --out docs/bench/precision

One statistics pass per accumulation (``vocabulary.ACCUMULATIONS``) over the same documents (same seed, held-out
choice and pieces), on one device, for every map kind. Then, per kind and split, both are fitted with the
penalty the float64 statistics choose, and compared:

- ``r2_max_diff``: the largest difference over upper layers between the float32-blocks maps' held-out R^2
  and the float64 maps', both scored on the float64 held-out sums (the maps' own quality);
- ``reported_r2_max_diff``: the same with each scored on its own held-out sums (what calibration prints);
- ``map_rel_diff``: ``|A32 - A64|_F / |A64|_F`` over every upper layer but the split layer (whose map is
  exact either way), and ``offset_rel_diff`` the same for ``b``; the lambda each would choose on its own.

The float32-blocks arithmetic is what a GPU pass runs with ``--accumulate float32-blocks`` (float32 products
of one piece, TF32 off, added into float64 totals), so running this on the CPU measures the CUDA path's
precision. A kind passes when ``r2_max_diff`` and ``reported_r2_max_diff`` are at most :data:`R2_TOLERANCE`
and ``map_rel_diff`` at most :data:`MAP_TOLERANCE` (a quarter of bfloat16's rounding, the dtype maps are
stored in).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any

import torch

from sgl_ridgefill.maps.kinds import MAP_KINDS, map_kind
from sgl_ridgefill.tools import args as argtypes
from sgl_ridgefill.vocabulary import ACCUMULATIONS

COMMAND = "sgl_ridgefill.calibration.precision"

from .config import CalibrationConfig, CalibrationError
from .solve import fit_split, kind_r2
from .stats import StatsState

R2_TOLERANCE = 1e-3
MAP_TOLERANCE = 2.0**-10  # bfloat16 keeps 8 significant bits: its relative rounding is up to 2^-8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def compare_kind(reference: StatsState, other: StatsState, split: int, kind: str) -> dict[str, Any]:
    """The float32-blocks statistics ``other`` against the float64 ``reference`` for one split and kind."""
    key = (split, kind)
    exact = reference.exact_kv.get(split) if map_kind(kind).predicts_kv else None
    ref = fit_split(reference.train[key], reference.heldout[key], None, kind=kind, exact=exact)
    own = fit_split(other.train[key], other.heldout[key], None, kind=kind, exact=exact)
    same = fit_split(other.train[key], other.heldout[key], ref.lam, kind=kind, exact=exact)
    true_r2 = kind_r2(reference.heldout[key], same.A, same.b, map_kind(kind))
    diffs = [abs(a - b) for a, b in zip(true_r2, ref.r2)]
    reported = [abs(a - b) for a, b in zip(same.r2, ref.r2)]
    return {
        "split": split,
        "kind": kind,
        "lambda_float64": ref.lam,
        "lambda_float32_blocks": own.lam,
        "mean_r2_float64": sum(ref.r2) / len(ref.r2),
        "mean_r2_float32_blocks": sum(true_r2) / len(true_r2),
        "r2_max_diff": max(diffs),
        "reported_r2_max_diff": max(reported),
        "map_rel_diff": _rel(same.A[1:], ref.A[1:]),
        "offset_rel_diff": _rel(same.b[1:], ref.b[1:]),
        "train_rows": reference.train[key].rows,
        "heldout_rows": reference.heldout[key].rows,
    }


def passes(entry: dict[str, Any]) -> bool:
    return (entry["r2_max_diff"] <= R2_TOLERANCE and entry["reported_r2_max_diff"] <= R2_TOLERANCE
            and entry["map_rel_diff"] <= MAP_TOLERANCE)


def run_study(model: str, *, corpus: str, splits: tuple[int, ...], max_tokens: int, work: pathlib.Path,
              device: str = "cpu", dtype: str = "auto", kinds: tuple[str, ...] = tuple(MAP_KINDS),
              doc_tokens: int = 2048, heldout_docs: int = 5, progress: bool = True) -> dict[str, Any]:
    """Both passes (resumed from ``work`` when already there), then every comparison."""
    from .pipeline import collect_stats

    states, timing = {}, {}
    for accumulate in ACCUMULATIONS:
        config = CalibrationConfig(model=model, corpus=corpus, splits=splits, out_dir=None, max_tokens=max_tokens,
                                   stats_dir=work / accumulate, dtype=dtype, device=device, accumulate=accumulate,
                                   kinds=kinds, doc_tokens=doc_tokens, heldout_docs=heldout_docs,
                                   progress=progress)
        start = time.perf_counter()
        states[accumulate], _, info = collect_stats(config)
        timing[accumulate] = {**info, "wall_s": round(time.perf_counter() - start, 1)}
    reference, other = (states[name] for name in ACCUMULATIONS)
    entries = [compare_kind(reference, other, split, kind) for split in splits for kind in reference.kinds]
    for entry in entries:
        entry["passes"] = passes(entry)
    return {
        "model": model,
        "corpus": corpus,
        "device": device,
        "dtype": reference.run["dtype"],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "max_tokens": max_tokens,
        "doc_tokens": doc_tokens,
        "heldout_docs": heldout_docs,
        "tolerance": {"r2": R2_TOLERANCE, "map_rel": MAP_TOLERANCE},
        "timing": timing,
        "kinds": entries,
        "float32_blocks_adequate": all(entry["passes"] for entry in entries),
    }


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [
        "# Statistics precision: float32 block products against float64",
        "",
        f"`{command}`",
        "",
        f"Model {result['model']}, corpus {result['corpus']}, {result['max_tokens']} training tokens in pieces of at "
        f"most {result['doc_tokens']}, {result['heldout_docs']} held-out documents, device "
        f"{result['device']}, CPU capability {result['cpu_capability']}, model dtype {result['dtype']}. "
        f"Tolerance: R² within {result['tolerance']['r2']:g}, maps within {result['tolerance']['map_rel']:.2g} "
        "(relative Frobenius norm).",
        "",
        "| split | kind | λ (float64) | λ (float32-blocks) | mean R² float64 | mean R² float32-blocks | max ΔR² | max ΔR² reported | ΔA rel | Δb rel | passes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in result["kinds"]:
        lines.append(
            f"| {e['split']} | {e['kind']} | {e['lambda_float64']:g} | {e['lambda_float32_blocks']:g} | "
            f"{e['mean_r2_float64']:.5f} | {e['mean_r2_float32_blocks']:.5f} | {e['r2_max_diff']:.2e} | "
            f"{e['reported_r2_max_diff']:.2e} | {e['map_rel_diff']:.2e} | {e['offset_rel_diff']:.2e} | "
            f"{'yes' if e['passes'] else 'no'} |"
        )
    lines += ["", "Accumulation time of each pass (this machine):", ""]
    for name, info in result["timing"].items():
        lines.append(f"- {name}: accumulation {info['accumulate_s']:.1f} s, forward {info['forward_s']:.1f} s "
                     f"({info['tokens']} tokens read this run)")
    verdict = "adequate" if result["float32_blocks_adequate"] else "not adequate"
    lines += ["", f"float32 block products: **{verdict}** at this tolerance for every kind above.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argtypes.command_parser(COMMAND, __doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", default="builtin")
    parser.add_argument("--splits", type=argtypes.layers, default=(12,), help="comma-separated split layers")
    parser.add_argument("--max-tokens", type=int, default=40_000)
    parser.add_argument("--doc-tokens", type=int, default=2048, help="longest forward piece (a float32 block)")
    parser.add_argument("--heldout-docs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kinds", type=argtypes.map_kinds, default=tuple(MAP_KINDS), help="comma-separated map kinds, or all")
    parser.add_argument("--work", type=pathlib.Path, default=None, help="statistics folders (default: OUT/stats)")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="folder for precision.json and PRECISION.md")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = run_study(args.model, corpus=args.corpus, splits=args.splits,
                           max_tokens=args.max_tokens, work=args.work or args.out / "stats", device=args.device,
                           dtype=args.dtype, kinds=args.kinds, doc_tokens=args.doc_tokens, heldout_docs=args.heldout_docs,
                           progress=not args.no_progress)
    except CalibrationError as exc:
        print(f"precision: error: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    command = argtypes.command_line(f"python -m {COMMAND}", argv)
    (args.out / "precision.json").write_text(json.dumps({**result, "command": command}, indent=1) + "\n")
    (args.out / "PRECISION.md").write_text(markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
