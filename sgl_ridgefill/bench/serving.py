"""``sgl-ridgefill bench-serving``: SGLang's own serving benchmark against a stock and a RidgeFill server.

    sgl-ridgefill bench-serving --model qwen2.5-coder-0.5b --ridgefill-maps DIR [--workloads NAMES]
        [--servers stock,ridgefill,ridgefill-no-insert] [--ridgefill-flags '--ridgefill-tail 1024']
        [--server-flags '--prefill-decode-interval 1'] [--out docs] [--scale 1.0]

The servers (:data:`SERVERS`: stock SGLang, RidgeFill with its default cache mode ``auto`` (``namespace`` for the
bare fill and for a policy that chooses its rows again over a reused cache, such as the shipped rows policies),
RidgeFill with
``--ridgefill-cache-mode no_insert``) run on this CPU (``sgl_ridgefill.cpu.launch_server``) on the same
model, all started before the first run: each workload runs on every server in turn with ``python -m
sglang.benchmark.serving --backend sglang`` (SGLang's client, not this project's), the radix cache flushed
before each run. The workloads (:data:`WORKLOADS`) are what long-prompt serving looks like:

- ``random-ids``: independent long prompts under concurrency (a cold prompt per request; other requests
  decode meanwhile, so the p99 inter-token latency says whether the prefill slows them);
- ``shared-prefix``: groups of questions on one long system prompt or document, asked in order (the radix
  cache's case: every question after a group's first prefills only its own tokens on stock SGLang);
- ``multi-turn``: the same with three turns per conversation, each turn sending the whole history.

Per workload and server the report holds TTFT mean, median and p99, p99 inter-token latency with the five
longest inter-token gaps (a p99 over a few hundred gaps is set by its few longest), request and output
throughput, the benchmark's duration and the client's command; ``docs/SERVING.md`` puts them side by
side with the machine (CPU model, capability, dtype) and ``docs/serving.json`` holds them as numbers. Every
server gets the same prompts in the same order (one seed), so each request's TTFT is also compared with stock's
for the same request (:func:`paired`): the median of those ratios says whether a difference of medians is
every request or a few, which eight requests' medians alone cannot. Two runs of the same server differ by
10-20 % per request on a small CPU, so ``--rounds N`` runs each workload N times on every server, the servers'
order reversed every other round and a new seed (new prompts) each round: the report pools the rounds' requests
(:func:`pool`) and pairs each round's requests with stock's of the same round.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

WORKLOADS: dict[str, tuple[str, ...]] = {
    "random-ids": ("--dataset-name", "random-ids", "--random-input-len", "6144", "--random-output-len", "32",
                   "--random-range-ratio", "1.0", "--num-prompts", "8", "--max-concurrency", "2"),
    "shared-prefix": ("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
                      "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "6144", "--gsp-question-len", "128",
                      "--gsp-output-len", "16", "--max-concurrency", "1", "--gsp-ordered"),
    "multi-turn": ("--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2",
                   "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "6144", "--gsp-question-len", "128",
                   "--gsp-output-len", "16", "--gsp-num-turns", "3", "--max-concurrency", "1", "--gsp-ordered"),
}
# SGLang's client runs multi-turn conversations through its chat backend only (the chat template applied).
BACKENDS = {"multi-turn": "sglang-oai-chat"}
# server -> its RidgeFill flags (None: stock SGLang), before --ridgefill-flags.
SERVERS: dict[str, tuple[str, ...] | None] = {
    "stock": None,
    "ridgefill": (),
    "ridgefill-no-insert": ("--ridgefill-cache-mode", "no_insert"),
}
# SGLang's serving benchmark's result fields -> the report's (seconds, milliseconds, per second).
FIELDS = {
    "mean_ttft_ms": ("ttft_mean_s", 1e-3), "median_ttft_ms": ("ttft_p50_s", 1e-3), "p99_ttft_ms": ("ttft_p99_s", 1e-3),
    "p99_itl_ms": ("itl_p99_ms", 1.0), "duration": ("duration_s", 1.0), "request_throughput": ("requests_per_s", 1.0),
    "output_throughput": ("output_tokens_per_s", 1.0), "completed": ("completed", 1),
}


def client_command(url: str, tokenizer: str, workload: str, output: pathlib.Path, *, seed: int = 0,
                   scale: float = 1.0) -> list[str]:
    """SGLang's benchmark client for one workload against ``url`` (``scale`` shrinks the prompt lengths)."""
    args = list(WORKLOADS[workload])
    if scale != 1.0:
        for flag in ("--random-input-len", "--gsp-system-prompt-len"):
            if flag in args:
                i = args.index(flag) + 1
                args[i] = str(max(16, int(int(args[i]) * scale)))
    return [sys.executable, "-m", "sglang.benchmark.serving", "--backend", BACKENDS.get(workload, "sglang"),
            "--base-url", url, "--tokenizer", tokenizer, "--seed", str(seed), "--output-file", str(output), "--output-details", "--disable-tqdm", *args]


LONGEST_GAPS = 5  # the report's longest inter-token gaps per run: a p99 over a few hundred is set by a few


def parse_result(line: Mapping[str, Any]) -> dict[str, Any]:
    """The report's fields of one result line of SGLang's benchmark; with its details (``itls``: every
    request's inter-token gaps, in seconds) also the :data:`LONGEST_GAPS` longest gaps and their count."""
    out = {}
    for key, (name, factor) in FIELDS.items():
        value = line.get(key)
        out[name] = None if value is None else (value * factor if isinstance(factor, float) else value)
    if line.get("itls") is not None:
        gaps = sorted((g * 1e3 for request in line["itls"] for g in request), reverse=True)
        out.update(itl_longest_ms=gaps[:LONGEST_GAPS], itl_count=len(gaps), itl_gaps_ms=gaps)
    if line.get("ttfts") is not None:
        out["ttfts_s"] = list(line["ttfts"])
    return out


def paired(entry: Mapping[str, Any], reference: str = "stock") -> dict[str, dict[str, Any]]:
    """Each server's TTFT against ``reference``'s request by request: ``median_ratio`` (the median over requests
    of server / reference TTFT), ``slower`` (requests where the server's was longer) of ``n``. Only servers whose
    every round has every request's TTFT, as many as the reference's in the same round (SGLang's client sends the
    same prompts in the same order for one seed); a pooled result pairs round by round (``rounds``)."""
    base = _round_ttfts(entry.get(reference))
    out = {}
    for server, r in entry.items():
        own = _round_ttfts(r)
        if server == reference or not base or len(own) != len(base):
            continue
        if any(not o or len(o) != len(b) or not all(t > 0 for t in b) for o, b in zip(own, base)):
            continue
        ratios = [a / b for o, bs in zip(own, base) for a, b in zip(o, bs)]
        out[server] = {"median_ratio": statistics.median(ratios), "slower": sum(x > 1 for x in ratios),
                       "n": len(ratios)}
    return out


def _round_ttfts(r: Mapping[str, Any] | None) -> list[list[float]]:
    """Every request's TTFT of ``r``, one list per round (an unpooled result is one round)."""
    if not r or "error" in r:
        return []
    rounds = r.get("rounds") or [r]
    return [list(x.get("ttfts_s") or []) for x in rounds]


def pool(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One server's result over several rounds of one workload: TTFT mean, median and p99 and the p99
    inter-token latency over every request and gap of every round (numpy's linear percentile, as SGLang's
    client computes them), the mean duration per round, throughput over the rounds' total time; ``rounds`` keeps
    each round's own figures. One round is returned as it is; a failed round makes the whole an error."""
    failed = [r["error"] for r in rounds if "error" in r]
    if failed:
        return {"error": failed[0], "rounds": [dict(r) for r in rounds]}
    if len(rounds) == 1:
        return {k: v for k, v in rounds[0].items() if k != "itl_gaps_ms"}
    import numpy as np

    ttfts = [t for r in rounds for t in r.get("ttfts_s") or []]
    gaps = sorted((g for r in rounds for g in r.get("itl_gaps_ms") or []), reverse=True)
    seconds = sum(r["duration_s"] for r in rounds)
    out = {
        "ttft_mean_s": float(np.mean(ttfts)), "ttft_p50_s": float(np.median(ttfts)),
        "ttft_p99_s": float(np.percentile(ttfts, 99)),
        "itl_p99_ms": float(np.percentile(gaps, 99)) if gaps else None,
        "duration_s": seconds / len(rounds),
        "requests_per_s": sum(r["completed"] for r in rounds) / seconds,
        "output_tokens_per_s": sum(r["output_tokens_per_s"] * r["duration_s"] for r in rounds) / seconds,
        "completed": sum(r["completed"] for r in rounds),
        "rounds": [{k: v for k, v in r.items() if k != "itl_gaps_ms"} for r in rounds],
    }
    if gaps:
        out.update(itl_longest_ms=gaps[:LONGEST_GAPS], itl_count=len(gaps))
    return out


def round_order(servers: Sequence[str], k: int) -> list[str]:
    """The servers' order in round ``k``: as given in even rounds, reversed in odd ones, so a drift of the
    machine over a run (warming, another process) weighs on every server alike."""
    return list(servers) if k % 2 == 0 else list(reversed(servers))


def run_client(command: list[str], output: pathlib.Path, *, timeout: float) -> dict[str, Any]:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not output.exists():
        raise RuntimeError(f"the benchmark client failed ({proc.returncode}): {proc.stderr[-3000:]}")
    lines = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"the benchmark client wrote no result to {output}")
    return parse_result(lines[-1])


def server_flags(model_dir: str, dtype: str, server: str, *, maps: str | None, extra: Sequence[str],
                 longest: int, shared: Sequence[str] = ()) -> list[str]:
    """The flags of one of :data:`SERVERS` (the CPU launcher adds its own): ``shared`` goes to every server,
    ``extra`` to the RidgeFill ones, last."""
    flags = ["--model-path", str(model_dir), "--dtype", dtype, "--max-total-tokens", str(4 * longest + 8192),
             "--mem-fraction-static", "0.6", *shared]
    own = SERVERS[server]
    if own is not None:
        flags += ["--prefill-backend", "ridgefill", "--ridgefill-maps", str(maps), *own, *extra]
    return flags


def markdown(report: Mapping[str, Any]) -> str:
    m = report["machine"]
    lines = [
        "# Serving: SGLang's serving benchmark, stock against RidgeFill",
        "",
        f"Generated by `{report['command']}`; do not edit by hand.",
        "",
        f"CPU {m.get('cpu_model')}; PyTorch capability {m.get('capability')}; dtype {m.get('dtype')}; "
        f"{m.get('threads')} thread(s). Every server on this CPU on {report['model']}, prompt lengths scaled by "
        f"{report.get('scale', 1.0)}; RidgeFill flags: `{' '.join(report['ridgefill_flags']) or '(defaults)'}` "
        "(`ridgefill` runs the default cache mode `auto`, `ridgefill-no-insert` adds `--ridgefill-cache-mode "
        "no_insert`)"
        + (f"; SGLang flags of every server: `{' '.join(report['server_flags'])}`" if report.get("server_flags") else "")
        + ". Each workload ran on every server in turn "
        "with `python -m sglang.benchmark.serving` (SGLang's client; its `sglang` backend, `sglang-oai-chat` for "
        "multi-turn, which it requires), the radix cache flushed before each run"
        + (f"; {report['rounds']} rounds, the servers' order reversed every other round and seed k in round k: "
           "TTFTs and inter-token gaps pool every round's requests, duration is per round, and each request is "
           "paired with stock's in its own round" if report.get("rounds", 1) > 1 else "") + ".",
        "",
        "| workload | server | TTFT mean | TTFT median | TTFT p99 | TTFT / stock's, same request (median; slower) | "
        "p99 ITL | duration | requests/s | output tok/s | longest ITLs (of all) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in report["workloads"].items():
        pairs = paired(entry)
        for server, r in entry.items():
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {name} | {server} | error: {r['error'][:120]} |||||||||")
                continue
            lines.append(
                f"| {name} | {server} | {r['ttft_mean_s']:.2f} s | {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s | "
                f"{_paired(pairs.get(server))} | {r['itl_p99_ms']:.0f} ms | {r['duration_s']:.1f} s | {r['requests_per_s']:.3f} | "
                f"{r['output_tokens_per_s']:.2f} | {_longest(r)} |"
            )
    lines += ["", "Client commands (URL and output file stand for the run's own; prompt lengths before the scale):", ""]
    lines += [f"- `{name}`: `python -m sglang.benchmark.serving --backend {BACKENDS.get(name, 'sglang')} {' '.join(WORKLOADS[name])}`"
              for name in report["workloads"]]
    return "\n".join(lines) + "\n"


def _paired(p: Mapping[str, Any] | None) -> str:
    return "–" if p is None else f"{p['median_ratio']:.3f}x; {p['slower']} of {p['n']}"


def _longest(r: Mapping[str, Any]) -> str:
    if not r.get("itl_longest_ms"):
        return "–"
    return f"{', '.join(f'{g:.0f}' for g in r['itl_longest_ms'])} ms of {r['itl_count']}"


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench-serving", help="SGLang's serving benchmark: stock vs RidgeFill servers on this CPU",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an HF folder or a `sgl-ridgefill model` name")
    p.add_argument("--ridgefill-maps", required=True, type=pathlib.Path, help="the RidgeFill server's maps")
    p.add_argument("--ridgefill-flags", type=shlex.split, default=[],
                   help="more flags for the RidgeFill server, one string (e.g. '--ridgefill-tail 1024')")
    p.add_argument("--server-flags", type=shlex.split, default=[],
                   help="SGLang flags for every server, stock included, one string (e.g. '--prefill-decode-interval 1')")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated, of {', '.join(SERVERS)}")
    p.add_argument("--dtype", default="auto", help="the servers' dtype (default auto: this CPU's)")
    p.add_argument("--scale", type=float, default=1.0, help="scale the prompt lengths (default 1.0)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"),
                   help="folder for SERVING.md and serving.json (default docs)")
    p.add_argument("--rounds", type=_positive, default=1,
                   help="runs of each workload on every server, the order reversed every other round and a new seed "
                        "each; the report pools them (default 1)")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds per client run (default 7200)")
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of rounds, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    import contextlib

    from ..cpu.dtype import choose_dtype
    from ..cpu.launch_server_process import running_server
    from ..models import resolve_model
    from ..tools.machine import machine_record

    workloads = [w for w in args.workloads.split(",") if w]
    servers = [s for s in args.servers.split(",") if s]
    for kind, names, known in (("workload", workloads, WORKLOADS), ("server", servers, SERVERS)):
        unknown = [w for w in names if w not in known]
        if unknown or not names:
            print(f"sgl-ridgefill bench-serving: unknown {kind}(s) {', '.join(unknown) or '(none given)'}; known: "
                  f"{', '.join(known)}", file=sys.stderr)
            return 2
    model_dir = str(resolve_model(args.model))
    dtype = choose_dtype(args.dtype)
    longest = int(6144 * args.scale) + 1024
    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(w) for w in ["sgl-ridgefill", "bench-serving", *sys.argv[2:]]),
        "rounds": args.rounds,
        "model": pathlib.Path(model_dir).name, "ridgefill_flags": list(args.ridgefill_flags),
        "server_flags": list(args.server_flags), "scale": args.scale,
        "machine": machine_record(dtype=dtype.dtype, server_env=None, server_local=True), "workloads": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)  # the servers' logs go there from the start
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        urls = {}
        for server in servers:
            flags = server_flags(model_dir, dtype.dtype, server, maps=str(args.ridgefill_maps),
                                 extra=args.ridgefill_flags, longest=longest, shared=args.server_flags)
            log = args.out / f"serving-{server}.log"
            print(f"starting the {server} server (log {log})", file=sys.stderr, flush=True)
            urls[server] = stack.enter_context(running_server(flags, log_path=log, timeout=1800))
        for workload in workloads:
            runs: dict[str, list[dict[str, Any]]] = {server: [] for server in servers}
            for k in range(args.rounds):
                for server in round_order(servers, k):
                    import urllib.request

                    urllib.request.urlopen(urllib.request.Request(urls[server] + "/flush_cache", method="POST"),
                                           timeout=60)
                    output = pathlib.Path(tmp) / f"{workload}-{server}-{k}.jsonl"
                    command = client_command(urls[server], model_dir, workload, output, seed=k, scale=args.scale)
                    try:
                        result = run_client(command, output, timeout=args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as error:
                        result = {"error": str(error)}
                    runs[server].append(result)
                    shown = {key: v for key, v in result.items() if key not in ("itl_gaps_ms", "ttfts_s")}
                    print(f"{workload} round {k + 1}/{args.rounds} {server}: {shown}", file=sys.stderr, flush=True)
            entry = report["workloads"].setdefault(workload, {})
            entry.update({server: pool(runs[server]) for server in servers})
            for server, pair in paired(entry).items():
                entry[server]["ttft_vs_stock"] = pair
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "serving.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "SERVING.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if all("error" not in r for e in report["workloads"].values() for r in e.values()) else 1
