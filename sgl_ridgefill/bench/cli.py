"""``sgl-ridgefill bench``: TTFT of exact against RidgeFill prefill on one running server.

    sgl-ridgefill bench --url http://127.0.0.1:30000 --lengths 2048,4096,8192 --pairs 3 --out DIR
        [--model-path DIR] [--split S | --ridgefill-maps DIR] [--tail T] [--exact-fraction F]
        [--rf-params JSON] [--warmup N] [--seed N] [--stream] [--no-flush] [--timeout S]
        [--server-pid PID]

The server must run ``--prefill-backend ridgefill`` (requests switch per request). Prints one line per
length and writes ``DIR/bench.json`` and ``DIR/bench.png``. User errors print one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any

from .bounds import ModelDims

DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_SPLIT = 12
DEFAULT_TAIL = 1024
# sgl_ridgefill.maps.format.MANIFEST, spelled out: importing the maps package pulls in torch, which the
# benchmark client does not need.
MAPS_MANIFEST = "manifest.json"


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts like 2048,4096, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive token counts, got {text!r}")
    return values


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"tail\": 2048}}', got {text!r}")
    return value


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the top-level ``sgl-ridgefill`` parser."""
    p = subparsers.add_parser(
        "bench", help="measure TTFT of exact vs RidgeFill prefill on a running server",
        description="Send the same prompts alternately exact and with RidgeFill (per-request switch) and compare "
        "their median TTFT with the layer-pass bound 1/r and a FLOP-counted bound.",
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"server address (default {DEFAULT_URL})")
    p.add_argument("--lengths", type=_lengths, default=(2048, 4096, 8192), help="prompt lengths in tokens (default 2048,4096,8192)")
    p.add_argument("--pairs", type=int, default=3, help="exact/RidgeFill pairs per length (default 3)")
    p.add_argument("--model-path", type=pathlib.Path, default=None, help="HF folder for the model's shape (default: the server's model_path)")
    p.add_argument("--ridgefill-maps", type=pathlib.Path, default=None, help="maps folder: its default split feeds the bounds")
    p.add_argument("--split", type=int, default=None, help=f"split layer for the bounds (default: the maps' default split, else {DEFAULT_SPLIT})")
    p.add_argument("--tail", type=int, default=DEFAULT_TAIL, help=f"tail length for the bounds (default {DEFAULT_TAIL})")
    p.add_argument("--exact-fraction", type=float, default=0.0, help="share of prefix rows the server's policy computes exactly (bounds only; default 0)")
    p.add_argument("--rf-params", type=_json_object, default={}, help='custom_params["ridgefill"] of the RidgeFill arm (default {}: the server\'s settings)')
    p.add_argument("--warmup", type=int, default=1, help="untimed pairs before measuring (default 1)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--stream", action="store_true", help="time the first streamed chunk instead of the whole 1-token request")
    p.add_argument("--no-flush", dest="flush", action="store_false", help="do not POST /flush_cache before each request")
    p.add_argument("--server-pid", type=int, default=None,
                   help="PID of a server on this machine: also record its processes' CPU seconds per request (Linux)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request (default 1800)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("ridgefill-bench"), help="folder for bench.json and bench.png (default ./ridgefill-bench)")
    p.set_defaults(func=run)


def _read_json(path: pathlib.Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{what}: {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: {path} is not valid JSON ({e.msg})") from None


def resolve_dims(model_path: pathlib.Path | None, server_info: dict[str, Any]) -> tuple[ModelDims, str]:
    """The model's shape from ``--model-path``, else from the server's ``model_path`` when it is a local folder."""
    if model_path is not None:
        config = model_path / "config.json"
        return ModelDims.from_hf_config(_read_json(config, "--model-path"), source=str(config)), str(config)
    served = server_info.get("model_path")
    if served and (pathlib.Path(served) / "config.json").is_file():
        config = pathlib.Path(served) / "config.json"
        return ModelDims.from_hf_config(_read_json(config, "server model_path"), source=str(config)), str(config)
    raise ValueError(
        f"cannot read the model's shape: the server's model_path {served!r} is not a local folder with a config.json; "
        "pass --model-path DIR"
    )


def resolve_split(split: int | None, maps: pathlib.Path | None) -> int:
    if split is not None:
        return split
    if maps is not None:
        manifest = _read_json(maps / MAPS_MANIFEST, "--ridgefill-maps")
        value = manifest.get("default_split")
        if not isinstance(value, int):
            raise ValueError(f"--ridgefill-maps: {maps / MAPS_MANIFEST} has no integer default_split")
        return value
    return DEFAULT_SPLIT


def run(args: argparse.Namespace) -> int:
    from .client import BenchClient, ServerError
    from .report import JSON_NAME, PNG_NAME, format_table, plot, report_dict, write_json
    from .runner import BenchConfig, run_bench

    try:
        client = BenchClient(args.url, timeout=args.timeout)
        info = client.model_info()
        dims, dims_source = resolve_dims(args.model_path, info)
        config = BenchConfig(
            lengths=tuple(args.lengths), vocab_size=dims.vocab_size, pairs=args.pairs,
            split=resolve_split(args.split, args.ridgefill_maps), tail=args.tail,
            exact_fraction=args.exact_fraction, rf_params=args.rf_params, seed=args.seed,
            warmup=args.warmup, flush=args.flush, stream=args.stream,
        )
        for n in config.lengths:
            config.shape(n)  # bounds inputs checked before any request is sent
        probe = None
        if args.server_pid is not None:
            from .procstat import ServerCpu

            probe = ServerCpu(args.server_pid)
        load_before = os.getloadavg()
        records, summaries = run_bench(
            client, config, dims, progress=lambda m: print(m, file=sys.stderr, flush=True), cpu_probe=probe
        )
        load_after = os.getloadavg()
    except (ServerError, ValueError) as e:
        print(f"sgl-ridgefill bench: error: {e}", file=sys.stderr)
        return 1
    print(format_table(summaries))
    if any(s.cache_hits for s in summaries):
        print("warning: some requests were served from the radix cache; their TTFT is not a full prefill", file=sys.stderr)
    server = {"url": args.url, "model_path": info.get("model_path"), "shape_from": dims_source,
              "loadavg_before": load_before, "loadavg_after": load_after}
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / JSON_NAME, report_dict(config, dims, records, summaries, server))
    title = f"{pathlib.Path(str(info.get('model_path', ''))).name}  S={config.bound_split} T={config.bound_tail}"
    plot(args.out / PNG_NAME, records, summaries, title=title)
    print(f"wrote {args.out / JSON_NAME} and {args.out / PNG_NAME}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m sgl_ridgefill.bench.cli``) until the top-level command wires it in."""
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
