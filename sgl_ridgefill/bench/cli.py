"""``sgl-ridgefill bench``: TTFT of exact against RidgeFill prefill on one running server.

    sgl-ridgefill bench --url http://127.0.0.1:30000 --lengths 2048,4096,8192 --pairs 3 --out DIR
        [--model-path DIR] [--split S | --ridgefill-maps DIR] [--tail T] [--ridgefill-policy NAME_OR_FILE]
        [--exact-fraction F] [--rf-params JSON] [--warmup N] [--seed N] [--stream] [--no-flush]
        [--timeout S] [--server-pid PID]
    sgl-ridgefill bench --serve MODEL --ridgefill-maps DIR [--ridgefill-policy NAME_OR_FILE]
        [--dtype auto|bfloat16|float32] ... --out 'docs/bench/{capability}-{dtype}'

The server must run ``--prefill-backend ridgefill`` (requests switch per request); ``--serve`` starts one on
this CPU (``sgl_ridgefill.cpu.launch_server``) and stops it at the end. With ``--ridgefill-policy`` the
RidgeFill arm runs that policy (``--serve`` starts the server with it; against ``--url`` a shipped policy is
asked for per request, which the server must allow with ``--ridgefill-request-policies``), its split and tail
feed the bounds (a split by prompt length, ``split S from N tokens``: each length's own), and a policy that
selects exact rows is measured beside the bare fill (the same split and tail at each length, the shipped
policy ``plain``) as a third arm; the FLOP-counted bound of each arm counts the exact rows
its responses report and, for the policy, what its selection costs. Prints one line per length and arm and
writes ``DIR/bench.json`` (with the machine: CPU model, capability, native bfloat16, dtype, threads; and the
command) and ``DIR/bench.png``; ``{capability}`` and ``{dtype}`` in ``--out`` become the measured ones
(``avx512``, ``bfloat16``). User errors print one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any

from ..cpu.dtype import CHOICES as DTYPE_CHOICES
from ..tools import args as argtypes
from ..tools.flops import ModelDims
from ..vocabulary import DEFAULT_TAIL

DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_SPLIT = 12
# sgl_ridgefill.maps.format.MANIFEST, spelled out: importing the maps package pulls in torch, which the
# benchmark client does not need.
MAPS_MANIFEST = "manifest.json"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` to the top-level ``sgl-ridgefill`` parser."""
    p = subparsers.add_parser(
        "bench", help="measure TTFT of exact vs RidgeFill prefill on a running server",
        description="Send the same prompts alternately exact and with RidgeFill (per-request switch) and compare "
        "their median TTFT with the layer-pass bound 1/r and a FLOP-counted bound.",
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"server address (default {DEFAULT_URL})")
    p.add_argument("--serve", metavar="MODEL", default=None,
                   help="start a RidgeFill server on this CPU for MODEL (a folder or a `sgl-ridgefill model` name) with "
                   "--ridgefill-maps, instead of using --url")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="with --serve: the server's dtype (default auto: bfloat16 where this CPU has native bfloat16 "
                   "matmuls, else float32)")
    p.add_argument("--lengths", type=argtypes.token_counts, default=(2048, 4096, 8192), help="prompt lengths in tokens (default 2048,4096,8192)")
    p.add_argument("--pairs", type=int, default=3, help="exact/RidgeFill pairs per length (default 3)")
    p.add_argument("--model-path", type=pathlib.Path, default=None, help="HF folder for the model's shape (default: the server's model_path)")
    p.add_argument("--ridgefill-maps", type=pathlib.Path, default=None, help="maps folder: its default split feeds the bounds")
    p.add_argument("--split", type=int, default=None, help=f"split layer for the bounds (default: the maps' default split, else {DEFAULT_SPLIT})")
    p.add_argument("--tail", type=int, default=None,
                   help=f"tail length for the bounds (default: the policy's, else {DEFAULT_TAIL})")
    p.add_argument("--ridgefill-policy", default=None, metavar="NAME_OR_FILE",
                   help="the RidgeFill arm's policy (a shipped name or a .rfpolicy file); with exact rows it is measured "
                   "beside the bare fill")
    p.add_argument("--exact-fraction", type=float, default=0.0, help="share of prefix rows the server's policy computes exactly (bounds only; default 0)")
    p.add_argument("--rf-params", type=argtypes.json_object, default={}, help='custom_params["ridgefill"] of the RidgeFill arm (default {}: the server\'s settings)')
    p.add_argument("--warmup", type=int, default=1, help="untimed pairs before measuring (default 1)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    p.add_argument("--stream", action="store_true", help="time the first streamed chunk instead of the whole 1-token request")
    p.add_argument("--no-flush", dest="flush", action="store_false", help="do not POST /flush_cache before each request")
    p.add_argument("--server-pid", type=int, default=None,
                   help="PID of a server on this machine: also record its processes' CPU seconds per request (Linux)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per request (default 1800)")
    p.add_argument("--out", default="ridgefill-bench",
                   help="folder for bench.json and bench.png; {capability} and {dtype} are replaced by this machine's "
                   "(e.g. 'docs/bench/{capability}-{dtype}'; default ./ridgefill-bench)")
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


def resolve_map_kind(maps: pathlib.Path | None) -> str | None:
    """The kind of the maps in ``maps`` (its manifest's ``map_kind``; ``None``, the residual map, without one)."""
    if maps is None:
        return None
    value = _read_json(maps / MAPS_MANIFEST, "--ridgefill-maps").get("map_kind")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"--ridgefill-maps: {maps / MAPS_MANIFEST} has a map_kind that is not a string: {value!r}")
    return value


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


def load_bench_policy(name: str | None, dims: ModelDims):
    """The compiled ``--ridgefill-policy`` for a model of ``dims``'s layers (``None`` without one)."""
    if name is None:
        return None
    from ..policy import ModelInfo, compile_policy, load_policy, resolve_policy_path
    from ..policy.errors import PolicyError

    kinds = dims.kinds()
    model = ModelInfo(num_layers=dims.num_layers, attention_layers=tuple(i for i, k in enumerate(kinds) if k == "attention"),
                      recurrent_layers=tuple(i for i, k in enumerate(kinds) if k != "attention"))
    try:
        return compile_policy(load_policy(resolve_policy_path(name)), model=model, defer_split=True)
    except (PolicyError, FileNotFoundError) as e:
        raise ValueError(f"--ridgefill-policy {name}: {e}") from None


def selector_flops(policy, dims: ModelDims, length: int, split: int, tail: int, *, passes: int = 2) -> float:
    """What the policy's selection costs at ``length`` tokens: each attention requirement's scores of its query
    rows against every key in its layers, ``passes`` times (the CUDA kernel's two passes; the CPU reference
    computes each score once); each probe's rows through the upper layers (projections, MLP and attention over
    the prompt)."""
    from ..selectors.base import AttentionRequirement, ProbeRequirement
    from ..tools.flops import attention_selector_flops

    total = 0.0
    for req in getattr(policy, "requirements", ()):
        if isinstance(req, AttentionRequirement):
            total += passes * attention_selector_flops(dims, length, len([l for l in req.layers if l < split]), req.q)
        elif isinstance(req, ProbeRequirement):
            rows = min(req.rows, tail, length)
            upper = dims.num_layers - split
            total += rows * upper * (2 * dims.layer_params + 4 * dims.head_dim * dims.num_heads * length)
    return total


def run(args: argparse.Namespace) -> int:
    if args.serve is None:
        return _measure(args, args.url, server_pid=args.server_pid, served=None)
    import contextlib

    from ..cpu.dtype import choose_dtype
    from ..cpu.launch_server_process import ridgefill_server_flags, running_server

    try:
        if args.ridgefill_maps is None:
            raise ValueError("--serve needs --ridgefill-maps (the maps the server fills with)")
        resolve_split(args.split, args.ridgefill_maps)  # a maps folder without a manifest fails before the server starts
        from ..models import resolve_model

        model_dir = resolve_model(args.serve)
    except ValueError as e:
        print(f"sgl-ridgefill bench: error: {e}", file=sys.stderr)
        return 1
    dtype = choose_dtype(args.dtype)
    print(dtype.line(), file=sys.stderr, flush=True)
    longest = max(args.lengths)
    flags = ridgefill_server_flags(model_dir, dtype.dtype, args.ridgefill_maps, tail=args.tail, longest=longest,
                                   split=args.split)
    if args.ridgefill_policy is not None:
        # The server runs the policy; the bare-fill arm asks for the shipped policy "plain" per request.
        flags += ["--ridgefill-policy", args.ridgefill_policy, "--ridgefill-request-policies", "plain"]
    if not _has_tokenizer(model_dir):  # a random-weight folder (tools/synthetic.py): the bench sends token ids
        flags += ["--skip-tokenizer-init"]
    started: list = []
    from ..models.fetch import default_cache_dir

    log = default_cache_dir() / "bench-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting the server (log: {log}) ...", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(running_server(flags, log_path=log, on_start=started.append))
        except (RuntimeError, TimeoutError) as e:
            print(f"sgl-ridgefill bench: error: {e}", file=sys.stderr)
            return 1
        if args.model_path is None:
            args.model_path = model_dir
        return _measure(args, url, server_pid=started[0].pid, served=dtype.dtype)


def _measure(args: argparse.Namespace, url: str, *, server_pid: int | None, served: str | None) -> int:
    from ..tools.client import BenchClient, ServerError
    from ..tools.machine import folder_name, machine_record, process_environment, served_dtype
    from .report import JSON_NAME, PNG_NAME, format_table, plot, report_dict, write_json
    from .runner import BenchConfig, run_bench

    try:
        client = BenchClient(url, timeout=args.timeout)
        info = client.model_info()
        dims, dims_source = resolve_dims(args.model_path, info)
        policy = load_bench_policy(args.ridgefill_policy, dims)
        server_info = _server_info(client)
        passes = 1 if server_info.get("device") == "cpu" else 2  # the selection statistics' passes there
        split = args.split or getattr(policy, "split", None) or resolve_split(None, args.ridgefill_maps)
        tail = args.tail or getattr(policy, "tail", None) or DEFAULT_TAIL
        rf_params, bare = dict(args.rf_params), None
        # A policy's split by prompt length: the server runs each length at its own split (unless --split, or a
        # split the requests ask for, decides).
        by_length = {n: policy.split_for(n) for n in args.lengths} if (
            policy is not None and policy.splits_by_length and args.split is None and "split" not in rf_params) else {}
        if policy is not None:
            if served is None and "policy" not in rf_params and not pathlib.Path(args.ridgefill_policy).exists():
                rf_params["policy"] = args.ridgefill_policy  # a shipped policy, asked for per request
            if policy.has_selection():
                bare = {"policy": "plain", "split": split, "tail": tail}
        config = BenchConfig(
            lengths=tuple(args.lengths), vocab_size=dims.vocab_size, pairs=args.pairs, split=split, tail=tail,
            exact_fraction=args.exact_fraction, rf_params=rf_params, seed=args.seed,
            warmup=args.warmup, flush=args.flush, stream=args.stream, map_kind=resolve_map_kind(args.ridgefill_maps),
            bare_params=bare, policy=args.ridgefill_policy, splits_by_length=by_length,
            selector_flops={n: selector_flops(policy, dims, n, by_length.get(n, split), tail, passes=passes)
                            for n in args.lengths} if policy else {},
        )
        for n in config.lengths:
            config.shape(n)  # bounds inputs checked before any request is sent
        if served is None:
            served = served_dtype(server_info, _read_json(pathlib.Path(dims_source), "model config"))
        server_env = process_environment(server_pid) if server_pid is not None else None
        machine = machine_record(dtype=served, server_env=server_env, server_local=server_pid is not None)
        out = pathlib.Path(args.out.format(capability=folder_name(machine).split("-")[0], dtype=machine["dtype"] or "unknown"))
        probe = None
        if server_pid is not None:
            from .procstat import ServerCpu

            probe = ServerCpu(server_pid)
        print(f"machine: {machine['cpu_model']}; capability {machine['capability']}; native bfloat16 "
              f"{'yes' if machine['native_bf16'] else 'no'}; dtype {machine['dtype']}; {machine['threads']} thread(s)",
              file=sys.stderr, flush=True)
        load_before = os.getloadavg()
        records, summaries = run_bench(
            client, config, dims, progress=lambda m: print(m, file=sys.stderr, flush=True), cpu_probe=probe
        )
        load_after = os.getloadavg()
    except (ServerError, ValueError, KeyError, IndexError) as e:
        print(f"sgl-ridgefill bench: error: {e}", file=sys.stderr)
        return 1
    print(format_table(summaries))
    if any(s.cache_hits for s in summaries):
        print("warning: some requests were served from the radix cache; their TTFT is not a full prefill", file=sys.stderr)
    server = {"url": url, "model_path": info.get("model_path"), "shape_from": dims_source,
              "loadavg_before": load_before, "loadavg_after": load_after}
    out.mkdir(parents=True, exist_ok=True)
    report = report_dict(config, dims, records, summaries, server)
    report["machine"] = machine
    report["command"] = command_line(args)
    write_json(out / JSON_NAME, report)
    title = f"{pathlib.Path(str(info.get('model_path', ''))).name}  S={config.split_label} T={config.bound_tail}  {folder_name(machine)}"
    plot(out / PNG_NAME, records, summaries, title=title)
    print(f"wrote {out / JSON_NAME} and {out / PNG_NAME}")
    return 0


def _server_info(client) -> dict[str, Any]:
    """``GET /get_server_info``, or ``{}`` from a server without it."""
    from ..tools.client import ServerError

    try:
        return client.get_json("/get_server_info")
    except ServerError:
        return {}


def command_line(args: argparse.Namespace) -> str:
    """The ``sgl-ridgefill bench`` command that reproduces this run (every setting that shapes it)."""
    import shlex

    words = ["sgl-ridgefill", "bench"]
    if args.serve is not None:
        words += ["--serve", str(args.serve), "--dtype", args.dtype]
    else:
        words += ["--url", args.url]
    if args.ridgefill_maps is not None:
        words += ["--ridgefill-maps", str(args.ridgefill_maps)]
    if args.ridgefill_policy is not None:
        words += ["--ridgefill-policy", args.ridgefill_policy]
    words += ["--lengths", ",".join(map(str, args.lengths)), "--pairs", str(args.pairs)]
    if args.split is not None:
        words += ["--split", str(args.split)]
    if args.tail is not None:
        words += ["--tail", str(args.tail)]
    if args.exact_fraction:
        words += ["--exact-fraction", str(args.exact_fraction)]
    if args.rf_params:
        words += ["--rf-params", json.dumps(args.rf_params, separators=(",", ":"))]
    if args.warmup != 1:
        words += ["--warmup", str(args.warmup)]
    words += [flag for flag, on in (("--stream", args.stream), ("--no-flush", not args.flush)) if on]
    words += ["--out", args.out]
    return " ".join(shlex.quote(w) for w in words)


def _has_tokenizer(model_dir) -> bool:
    import pathlib

    folder = pathlib.Path(model_dir)
    return any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))
