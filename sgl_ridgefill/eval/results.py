"""Regenerate ``docs/RESULTS.md``: fit the maps, run ``sgl-ridgefill eval`` for each model and split, copy
each report next to it, and join them.

    python -m sgl_ridgefill.eval.results                 # everything (hours on a 2-core CPU; resumable)
    python -m sgl_ridgefill.eval.results --only qwen2.5-0.5b-s12
    python -m sgl_ridgefill.eval.results --report-only   # rewrite each run's report from its raw results
    python -m sgl_ridgefill.eval.results --render-only   # rejoin the reports already in docs/results/

Raw results (``results.jsonl``, server logs) stay under ``--runs-dir``; the repository keeps the reports,
plots and ``summary.json`` under ``docs/results/<run>/``. Every step resumes where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil
import subprocess
import sys

from ..models.fetch import default_cache_dir

REPO_DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
COMMAND = "python -m sgl_ridgefill.eval.results"
CALIBRATION_TOKENS = 200_000


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    model: str
    splits: tuple[int, ...]  # the maps folder's splits (one calibration pass fits them all)
    split: int
    lengths: tuple[int, ...]
    extra: tuple[str, ...] = ()  # more `sgl-ridgefill eval` flags

    def maps_name(self) -> str:
        return f"{self.model}-s{'-'.join(map(str, self.splits))}-{CALIBRATION_TOKENS // 1000}k"


# The shallower splits run the four main arms and the splices only, on fewer prompts, to fit a 2-core CPU.
_SHALLOW = ("--depths", "3", "--docs", "2", "--needle-arms", "exact,nofill,identity,ridgefill",
            "--loss-arms", "exact,nofill,identity,ridgefill,splice:keys,splice:values,splice:both,splice:key_norm")

# Longer prompts at half depth: the same reduced set at 8K, and one prompt per depth and haystack at 16K.
_LONG_16K = ("--depths", "1", "--docs", "1", "--needle-arms", "exact,nofill,identity,ridgefill",
             "--loss-arms", "exact,nofill,identity,ridgefill,splice:keys")

# Half depth and one shallower split for the Qwen2-family 0.5B (24 layers, no QK-norm) and SmolLM2-135M
# (Llama family, 30 layers, 8K context); T = 1024.
RUNS = (
    Run("qwen2.5-0.5b-s12", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,)),
    Run("smollm2-135m-s15", "smollm2-135m", (8, 15), 15, (4096,)),
    Run("smollm2-135m-s8", "smollm2-135m", (8, 15), 8, (4096,), _SHALLOW),
    Run("qwen2.5-0.5b-s6", "qwen2.5-coder-0.5b", (6, 12), 6, (4096,), _SHALLOW),
    Run("qwen2.5-0.5b-s12-8k", "qwen2.5-coder-0.5b", (6, 12), 12, (8192,), _SHALLOW),
    Run("qwen2.5-0.5b-s12-16k", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,), _LONG_16K),
    # SmolLM2's context is 8,192 tokens: its longest prompts leave room for the answer.
    Run("smollm2-135m-s15-8k", "smollm2-135m", (8, 15), 15, (8064,), _SHALLOW),
)


def _sh(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def run_one(run: Run, runs_dir: pathlib.Path, docs: pathlib.Path, *, report_only: bool = False) -> pathlib.Path | None:
    """Run (or resume) one evaluation and copy its report to ``docs/results/<run>/``; with ``report_only``,
    rewrite the report from the raw results alone (None when the run has none yet)."""
    maps = runs_dir / "maps" / run.maps_name()
    out = runs_dir / run.name
    if report_only and not (out / "results.jsonl").exists():
        print(f"{run.name}: no results under {out} yet; skipped", flush=True)
        return None
    if not report_only and not (maps / "manifest.json").exists():
        _sh([sys.executable, "-m", "sgl_ridgefill.cli", "calibrate", "--model", run.model, "--corpus", "builtin",
             "--splits", ",".join(map(str, run.splits)), "--max-tokens", str(CALIBRATION_TOKENS), "--out", str(maps),
             "--force"])
    _sh([sys.executable, "-m", "sgl_ridgefill.cli", "eval", "--model", run.model, "--maps", str(maps), "--split",
         str(run.split), "--tail", "1024", "--lengths", ",".join(map(str, run.lengths)), "--out", str(out), *run.extra,
         *(("--report-only",) if report_only else ())])
    target = docs / "results" / run.name
    target.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.suffix in (".md", ".png") or f.name in ("summary.json", "eval-rows.rfpolicy"):
            shutil.copy2(f, target / f.name)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=pathlib.Path, default=default_cache_dir().parent / "eval",
                        help="raw results and maps (default ~/.cache/sgl-ridgefill/eval)")
    parser.add_argument("--docs", type=pathlib.Path, default=REPO_DOCS, help="where RESULTS.md and results/ go")
    parser.add_argument("--only", default=None, help=f"comma-separated run names ({', '.join(r.name for r in RUNS)})")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite each run's report from its raw results (no requests), then join them")
    parser.add_argument("--render-only", action="store_true", help="only join the reports already under DOCS/results")
    args = parser.parse_args(argv)
    names = [r.name for r in RUNS]
    chosen = RUNS if args.only is None else tuple(r for r in RUNS if r.name in args.only.split(","))
    unknown = set((args.only or "").split(",")) - set(names) - {""}
    if unknown:
        parser.error(f"unknown run(s) {', '.join(sorted(unknown))}; known: {', '.join(names)}")
    if args.report_only and args.render_only:
        parser.error("--report-only and --render-only: pick one")
    if not args.render_only:
        for run in chosen:
            run_one(run, args.runs_dir, args.docs, report_only=args.report_only)
    from .report import render_results_md

    present = [args.docs / "results" / n for n in names if (args.docs / "results" / n / "REPORT.md").exists()]
    if not present:
        print("no reports under docs/results yet", file=sys.stderr)
        return 1
    path = render_results_md(present, args.docs / "RESULTS.md", COMMAND)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
