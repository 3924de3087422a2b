"""``sgl-ridgefill``: one command for calibration, models, policies, benchmarks and the CPU server.

Each sub-command lives beside the code it drives and registers itself with ``add_subparser``; imports are
lazy so ``sgl-ridgefill --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module with add_subparser, what it adds)
COMMANDS = (
    ("sgl_ridgefill.models.cli", "model fetch: real small models from PyPI, converted to HF folders"),
    ("sgl_ridgefill.calibration.cli", "calibrate: fit the ridge maps"),
    ("sgl_ridgefill.policy.cli", "policy check/fmt/explain: .rfpolicy files"),
    ("sgl_ridgefill.bench.cli", "bench: TTFT of exact vs RidgeFill against a running server"),
    ("sgl_ridgefill.bench.serving", "bench-serving: SGLang's serving benchmark, stock vs RidgeFill servers on this CPU"),
    ("sgl_ridgefill.gpu_check.cli", "gpu-check: kernels and SGLang's Triton attention on a GPU; stock vs RidgeFill servers"),
    ("sgl_ridgefill.eval.cli", "eval: needles in the filled region, key-token loss, splice tests, agreement"),
    ("sgl_ridgefill.demo", "demo: the main job end to end on CPU"),
    ("sgl_ridgefill.soak.cli", "soak: concurrent clients and a fuzzer against a RidgeFill server, exact answers vs stock"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgl-ridgefill", description="RidgeFill: training-free prefill acceleration for SGLang.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module, _ in COMMANDS:
        importlib.import_module(module).add_subparser(sub)
    serve = sub.add_parser("serve-cpu", help="start SGLang's server on this CPU-only machine (flags pass through)",
                           add_help=False)
    serve.set_defaults(func=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve-cpu":
        from .cpu.launch_server import main as launch

        launch(argv[1:])
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
