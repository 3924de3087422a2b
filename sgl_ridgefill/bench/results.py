"""Regenerate ``docs/BENCHMARKS.md`` from the benchmark folders ``docs/bench/<capability>-<dtype>/``.

    python -m sgl_ridgefill.bench.results            # rewrite docs/BENCHMARKS.md
    python -m sgl_ridgefill.bench.results --check    # exit 1 when docs/BENCHMARKS.md is out of date

Each folder holds one ``bench.json`` written by ``sgl-ridgefill bench`` (:data:`FOLDER_COMMAND`), which
records the machine (CPU model, PyTorch's capability, native bfloat16, dtype, threads) beside the
measurements; one table per folder: per length, exact and RidgeFill TTFT (medians), the speedup with the
range of per-pair ratios, the layer-pass bound ``1/r``, the FLOP-counted bound, and the fraction of each
reached. Nothing here starts a server or imports torch.
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..tools import args as argtypes
from .runner import resolve_split, resolve_tail

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH_DIR = REPO / "docs" / "bench"
OUTPUT = REPO / "docs" / "BENCHMARKS.md"
COMMAND = "python -m sgl_ridgefill.bench.results"
# The command that makes one folder, run on an otherwise idle machine from the repository root.
FOLDER_COMMAND = (
    "sgl-ridgefill bench --serve qwen2.5-coder-0.5b --ridgefill-maps sgl_ridgefill/demo_maps/qwen2.5-coder-0.5b-s12 "
    "--lengths 2048,4096,8192,16384 --pairs 3 --split 12 --tail 1024 --out 'docs/bench/{capability}-{dtype}'"
)
# The shipped rows policy (exact rows by pooled attention), beside the bare fill and exact, in folders "-rows".
ROWS_COMMAND = (
    "sgl-ridgefill bench --serve qwen2.5-coder-0.5b --ridgefill-maps sgl_ridgefill/demo_maps/qwen2.5-coder-0.5b-s12 "
    "--ridgefill-policy qwen2.5-0.5b-rows --lengths 4096,8192,16384 --pairs 2 --out 'docs/bench/{capability}-{dtype}-rows'"
)


def load_folders(bench_dir: pathlib.Path) -> list[tuple[str, dict[str, Any]]]:
    """``(folder name, bench.json)`` of every ``bench_dir/*/bench.json``, sorted by folder name."""
    out = []
    for path in sorted(bench_dir.glob("*/bench.json")):
        try:
            out.append((path.parent.name, json.loads(path.read_text())))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e.msg})") from None
    return out


def _seconds(value: float) -> str:
    return f"{value:.2f} s"


def _times(value: float) -> str:
    return f"{value:.2f}×"


def _machine_line(report: Mapping[str, Any]) -> str:
    m = report.get("machine") or {}
    native = m.get("native_bf16")
    bf16 = "unknown" if native is None else ("yes" + (f" ({m['bf16_hardware']})" if m.get("bf16_hardware") else "")) if native else "no"
    caps = m.get("isa_caps") or {}
    capped = f"; ISA capped with {', '.join(f'{k}={v}' for k, v in sorted(caps.items()))}" if caps else ""
    where = "" if m.get("server_on_this_machine", True) else " (the benchmark client's; the server ran elsewhere)"
    return (f"CPU {m.get('cpu_model') or 'unknown'}{where}; PyTorch capability {m.get('capability') or 'unknown'}"
            f"{capped}; native bfloat16 {bf16}; dtype {m.get('dtype') or 'unknown'}; {m.get('threads', '?')} thread(s)")


def table(report: Mapping[str, Any]) -> str:
    """The Markdown table of one ``bench.json``, one row per length (and arm, beside a policy with rows)."""
    summary = report.get("summary", [])
    arms = any(s.get("arm", "ridgefill") != "ridgefill" for s in summary)
    policy = (report.get("config") or {}).get("policy") or "RidgeFill"
    head = "| tokens | " + ("arm | exact rows | " if arms else "") + "exact | RidgeFill | speedup (pair range) | "
    lines = [head + "bound 1/r | reached | FLOP-counted bound | reached |",
             "|---|" + ("---|---|" if arms else "") + "---|---|---|---|---|---|---|"]
    for s in summary:
        arm = ""
        if arms:
            rows = "–" if s.get("exact_rows") is None else f"{s['exact_rows']:,.0f}"
            arm = f"{'bare fill' if s.get('arm') == 'bare' else policy} | {rows} | "
        lines.append(
            f"| {s['length']:,} | {arm}{_seconds(s['exact_median'])} | {_seconds(s['ridgefill_median'])} | "
            f"{_times(s['speedup'])} ({s['ratio_min']:.2f}–{s['ratio_max']:.2f}) | {_times(s['layer_bound'])} | "
            f"{s['layer_fraction']:.0%} | {_times(s['flop_bound'])} | {s['flop_fraction']:.0%} |"
        )
    return "\n".join(lines)


def section(name: str, report: Mapping[str, Any]) -> str:
    config = report.get("config") or {}
    model = report.get("model") or {}
    server = report.get("server") or {}
    model_name = pathlib.Path(str(server.get("model_path") or "")).name or "model"
    rf_params = config.get("rf_params") or {}
    by_length = {int(n): s for n, s in (config.get("splits_by_length") or {}).items()}
    split = resolve_split(rf_params, {}, config.get("split"))
    at = {n: resolve_split(rf_params, by_length, split, n) for n in sorted(by_length)}
    if any(s != split for s in at.values()):
        split = f"{split} ({', '.join(f'{s} at {n:,} tokens' for n, s in at.items() if s != split)})"
    tail = resolve_tail(rf_params, config.get("tail"))
    head = [
        f"## `{name}`",
        "",
        _machine_line(report) + ".",
        "",
        f"{model_name} ({model.get('num_layers', '?')} layers), S = {split}, T = {tail}; "
        f"median of {config.get('pairs')} pairs per length, exact and RidgeFill alternating on one server, radix cache "
        f"{'flushed before every request' if config.get('flush', True) else 'not flushed'}.",
    ]
    if report.get("command"):
        head += ["", f"Made with `{report['command']}`."]
    return "\n".join(head + ["", table(report)])


def render(folders: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    intro = [
        "# Benchmarks: time to first token, exact against RidgeFill, per CPU",
        "",
        f"Generated by `{COMMAND}` from `docs/bench/<capability>-<dtype>/bench.json`; do not edit by hand.",
        "",
        "Each folder is made by one command on an otherwise idle machine, from the repository root (it starts a",
        "RidgeFill server on this CPU with the shipped demo maps, measures, writes `bench.json` and `bench.png`",
        "into the folder named after the CPU's capability and the dtype, and stops the server):",
        "",
        "```bash",
        FOLDER_COMMAND,
        "# the other dtype on a CPU with native bfloat16 (the default there is bfloat16):",
        FOLDER_COMMAND.replace("--serve qwen2.5-coder-0.5b", "--serve qwen2.5-coder-0.5b --dtype float32"),
        "# the shipped rows policy (exact, the bare fill and the policy side by side):",
        ROWS_COMMAND,
        f"{COMMAND}   # then rewrite this page",
        "```",
        "",
        "`dtype auto` (the default) is bfloat16 where the CPU has native bfloat16 matmuls (AMX or AVX-512 BF16) and",
        "float32 elsewhere (`sgl_ridgefill/cpu/dtype.py`). `reached` is the measured speedup over the bound.",
    ]
    if not folders:
        intro += ["", "No benchmark folder yet: run the command above."]
    body = [section(name, report) for name, report in folders]
    return "\n\n".join(["\n".join(intro), *body]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argtypes.command_parser(COMMAND.removeprefix("python -m "), __doc__)
    parser.add_argument("--bench-dir", type=pathlib.Path, default=BENCH_DIR, help="folders of bench.json (default docs/bench)")
    parser.add_argument("--out", type=pathlib.Path, default=OUTPUT, help="the page to write (default docs/BENCHMARKS.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    try:
        text = render(load_folders(args.bench_dir))
    except (ValueError, KeyError) as e:
        print(f"{COMMAND}: error: {e}", file=sys.stderr)
        return 1
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != text:
            print(f"{args.out} is out of date; run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
