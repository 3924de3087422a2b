"""``sgl-ridgefill gpu-check`` / ``python -m sgl_ridgefill.gpu_check``: the two tiers and the preparation.

Exit status: 0 when every step ran and every check held (or the tier skipped itself: no CUDA), 1 when a
correctness check failed, a step broke or RidgeFill-off answers differ from stock; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import platform
import shlex
import sys
import time
from typing import Any

from ..attention.backends import GPU_BACKENDS
from ..tools import args as argtypes
from . import report as out
from .sgl_files import DEFAULT_DIR, SglFilesMissing, copy_sgl_files

TIERS = ("kernels", "server", "host")
# In order of what the numbers decide: map backend, scattered-row cost, planning overhead, the fill.
KERNEL_STEPS = ("maps", "row_attention", "planner", "host_path", "fill", "maps_int8", "attention_stats",
                "map_stream", "calibration")
DEFAULT_BUDGET_S = 420.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", choices=TIERS, default="kernels",
                   help="kernels (torch + triton only), server (SGLang on a GPU) or host (the host census on this CPU)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gpu-check"),
                   help=f"a .json file, or a folder for {out.JSON_NAME} and gpu-check.txt (default ./gpu-check)")
    p.add_argument("--copy-sgl-files", type=pathlib.Path, metavar="DIR",
                   help=f"prepare: copy SGLang's three Triton attention files into DIR (e.g. {DEFAULT_DIR}) and exit")
    k = p.add_argument_group("tier kernels")
    k.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda (default; skips itself without CUDA) or cpu: tiny sizes, float32, Triton interpreter")
    k.add_argument("--sgl-files", type=pathlib.Path, default=DEFAULT_DIR,
                   help=f"folder with SGLang's Triton attention files (default {DEFAULT_DIR}; absent: that step skips)")
    k.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for 'of peak' (default: 989.4 on H100/H200, their spec; bf16 GEMMs reach "
                        "about 790 in practice)")
    k.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"stop starting new cases after this many seconds (default {DEFAULT_BUDGET_S:.0f})")
    k.add_argument("--only", type=argtypes.csv, default=KERNEL_STEPS, metavar="STEPS",
                   help=f"comma-separated steps (default all: {','.join(KERNEL_STEPS)})")
    s = p.add_argument_group("tier server")
    s.add_argument("--backends", type=argtypes.choices(tuple(GPU_BACKENDS), what="backend"), default=tuple(GPU_BACKENDS),
                   help=f"default {','.join(GPU_BACKENDS)}")
    s.add_argument("--lengths", type=argtypes.token_counts, default=(8192, 16384, 32768), help="prompt tokens (default 8192,16384,32768)")
    s.add_argument("--pairs", type=int, default=3, help="exact/RidgeFill pairs per length (default 3)")
    s.add_argument("--warmup", type=int, default=1, help="untimed requests before measuring (default 1)")
    s.add_argument("--shape", default="llama-3.1-8b", help="random-weight model shape: llama-3.1-8b (default) or qwen2-0.5b")
    s.add_argument("--model-path", type=pathlib.Path, help="an HF folder to serve instead of a random-weight model")
    s.add_argument("--ridgefill-maps", type=pathlib.Path, help="maps for --model-path (default: near-identity maps)")
    s.add_argument("--workdir", type=pathlib.Path, default=pathlib.Path(".gpucheck/server"),
                   help="where the random-weight model and maps are made once (default .gpucheck/server)")
    s.add_argument("--split", type=int, default=12, help="split layer S (default 12)")
    s.add_argument("--tail", type=int, default=4096, help="tail T (default 4096, the shipped 8B policies')")
    s.add_argument("--rows-policy", default="llama-3.1-8b-rows",
                   help="shipped policy with exact rows measured beside the bare fill (default llama-3.1-8b-rows; "
                        "'none': the bare fill only)")
    s.add_argument("--identity-prompts", type=int, default=3, help="greedy prompts compared with stock (default 3)")
    s.add_argument("--server-args", type=shlex.split, default=(),
                   help="extra flags for every server, one string: --server-args='--flag value ...'")
    s.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds for a server to come up")
    s.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``gpu-check`` to the top-level ``sgl-ridgefill`` parser."""
    p = subparsers.add_parser("gpu-check", help="kernels, planner and SGLang's Triton attention on a GPU; stock vs "
                              "RidgeFill servers", description=(__package__ and sys.modules[__package__].__doc__))
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.copy_sgl_files is not None:
        try:
            copies = copy_sgl_files(args.copy_sgl_files)
        except SglFilesMissing as error:
            print(f"gpu-check: {error}", file=sys.stderr)
            return 1
        print("copied " + ", ".join(str(c) for c in copies) + " (SGLang's files: keep them out of git)")
        return 0
    if args.tier == "host":
        return run_host(args)
    return run_kernels(args) if args.tier == "kernels" else run_server(args)


def run_host(args: argparse.Namespace) -> int:
    """The host census (``host_census.py``) into ``--out``; 1 when a request exceeds its budget or a pair
    differs."""
    from .host_census import run_census

    folder = args.out if args.out.suffix != ".json" else args.out.parent
    report = run_census(folder)
    return 1 if report["verdicts"] or any("census" not in r for r in report["rows"]) else 0


# ---------------------------------------------------------------------------------------------- kernels


def run_kernels(args: argparse.Namespace) -> int:
    unknown = [s for s in args.only if s not in KERNEL_STEPS]
    if unknown:
        print(f"gpu-check: unknown step(s) {', '.join(unknown)}; known: {', '.join(KERNEL_STEPS)}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        problem = _interpreter_on()
        if problem:
            print(f"gpu-check: {problem}", file=sys.stderr)
            return 2
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here: the kernels tier skips itself (--device cpu runs its CPU smoke mode)")
        return 0
    from . import calibration_step, kernel_steps, map_stream, row_attention
    from .check import GPU, SMOKE, Context, run_step

    device = torch.device(args.device)
    sizes, dtype = (GPU, torch.bfloat16) if device.type == "cuda" else (SMOKE, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 references must be float32
    ctx = Context(device=device, dtype=dtype, sizes=sizes, deadline=time.monotonic() + args.budget_s,
                  peak_tflops=_peak(args.peak_tflops, device), sgl_files=str(args.sgl_files), say=_say)
    steps = {"maps": kernel_steps.maps, "maps_int8": kernel_steps.maps_int8,
             "attention_stats": kernel_steps.attention_stats, "fill": kernel_steps.fill,
             "planner": kernel_steps.planner, "host_path": kernel_steps.host_path,
             "row_attention": row_attention.row_attention, "map_stream": map_stream.step,
             "calibration": calibration_step.calibration}
    path = out.output_path(args.out)
    report: dict[str, Any] = {
        "tier": "kernels", "command": sys.argv, "environment": _environment(device), "dtype": str(dtype),
        "peak_tflops": ctx.peak_tflops, "budget_s": args.budget_s, "sizes": dataclasses.asdict(sizes), "steps": {},
    }
    tables = []
    for name in KERNEL_STEPS:
        if name not in args.only:
            continue
        _say(f"== {name}")
        result = run_step(name, steps[name], ctx)
        report["steps"][name] = result.to_dict()
        report["sglang_imported"] = "sglang" in sys.modules  # must stay False: the check runs without SGLang
        out.write_json(path, report)
        text = f"== {name}: {result.status} in {result.seconds:.1f} s" + (f": {result.note}" if result.note else "")
        text += "\n" + out.table(name, result.rows) if result.rows else ""
        tables.append(text)
        print(text, flush=True)
    path.with_suffix(".txt").write_text("\n\n".join(tables) + "\n")
    bad = {n: r["status"] for n, r in report["steps"].items() if r["status"] in ("failed", "error")}
    print(f"wrote {path}" + (f"; problems: {bad}" if bad else ""))
    return 1 if bad else 0


def _interpreter_on() -> str | None:
    """Switch the Triton interpreter on for the CPU smoke run (before anything imports triton)."""
    if "triton" in sys.modules:
        import triton

        if not triton.knobs.runtime.interpret:
            return "--device cpu needs TRITON_INTERPRET=1 before triton is imported, and triton is already imported"
        return None
    os.environ["TRITON_INTERPRET"] = "1"
    return None


def _peak(flag: float | None, device) -> float | None:
    if flag is not None or device.type != "cuda":
        return flag
    import torch

    from sgl_ridgefill.kernels.bench import PEAK_BF16_TFLOPS

    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def _environment(device) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env.update(device=torch.cuda.get_device_name(device), capability=list(torch.cuda.get_device_capability(device)))
    else:
        env.update(device="cpu", triton_interpret=os.environ.get("TRITON_INTERPRET"))
    return env


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- server


def run_server(args: argparse.Namespace, launcher=None) -> int:
    """The server tier; ``launcher`` replaces the subprocess launcher (tests)."""
    from functools import partial

    from .server import ServerCheckConfig, run_server_check, server_table, subprocess_launcher

    path = out.output_path(args.out)
    try:
        model, maps = _server_model(args)
        cfg = ServerCheckConfig(
            model_path=model, maps_path=maps, backends=tuple(args.backends), lengths=tuple(args.lengths),
            pairs=args.pairs, warmup=args.warmup, split=args.split, tail=args.tail,
            rows_policy=None if args.rows_policy in (None, "none") else args.rows_policy,
            identity_prompts=args.identity_prompts, server_args=tuple(args.server_args),
            request_timeout=args.timeout, startup_timeout=args.startup_timeout,
        )
        launch = launcher or partial(subprocess_launcher, timeout=cfg.startup_timeout, log_dir=path.parent)
        header = {"tier": "server", "command": sys.argv, "config": {k: str(v) for k, v in vars(cfg).items()}}
        report = run_server_check(cfg, launch, say=_say, on_backend=lambda r: out.write_json(path, {**header, **r}))
    except ValueError as error:
        print(f"gpu-check: error: {error}", file=sys.stderr)
        return 1
    report = {**header, **report}
    out.write_json(path, report)
    text = server_table(report)
    path.with_suffix(".txt").write_text(text + "\n")
    print(text)
    print(f"wrote {path}")
    bad = [b for b, e in report["backends"].items() if "error" in e or not e["identity"]["identical"]]
    return 1 if bad else 0


def _server_model(args: argparse.Namespace) -> tuple[pathlib.Path, pathlib.Path]:
    """``--model-path`` and ``--ridgefill-maps``, or a random-weight model of ``--shape`` and near-identity maps
    made once under ``--workdir`` (weights drawn on the GPU)."""
    if args.model_path is not None:
        if args.ridgefill_maps is None:
            raise ValueError("--model-path needs --ridgefill-maps (maps fitted for that model)")
        return args.model_path, args.ridgefill_maps
    from sgl_ridgefill.tools.synthetic import SHAPES, make_model_and_maps

    if args.shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(sorted(SHAPES))}, got {args.shape!r}")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    return make_model_and_maps(args.workdir / args.shape, SHAPES[args.shape], split=args.split, device=device)


def main(argv: list[str] | None = None) -> int:
    parser = argtypes.command_parser("sgl_ridgefill.gpu_check", sys.modules[__package__].__doc__, whole_doc=True)
    add_arguments(parser)
    return run(parser.parse_args(argv))
