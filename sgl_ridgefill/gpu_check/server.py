"""Tier ``server``: stock SGLang against RidgeFill on a GPU machine with SGLang and FlashInfer installed.

For every attention backend of ``--backends``, two servers on the same random-weight model, one after the
other (one GPU):

1. **stock** SGLang (this plugin left out through ``SGLANG_PLUGINS``): greedy identity prompts, then the
   TTFT of the benchmark's prompts at every length, radix cache flushed before every request;
2. **RidgeFill** (``--prefill-backend ridgefill`` with the synthetic maps): the same identity prompts with
   RidgeFill off per request, compared with stock's answers (output ids and output logprobs, exactly);
   then ``sgl-ridgefill bench``'s alternating measurement (cache flushed before every request) of exact,
   the bare fill and the shipped rows policy (``--rows-policy``, default ``llama-3.1-8b-rows``: 10 % of the
   prefix exact, the configuration the published quality rests on; asked for per request), with the
   layer-pass and FLOP-counted bounds (counting the exact rows each response reports) and the fraction of
   each reached. T defaults to 4,096, the shipped 8B policies' tail.

The servers are started through a *launcher* (``spec -> context manager yielding the URL``), so the plan
(command lines, environments, request schedule) is tested on a CPU with a fake one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ContextManager

from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.tools.client import BenchClient, ServerError
from sgl_ridgefill.bench.runner import EXACT_PARAMS, BenchConfig, make_prompt, run_bench
from sgl_ridgefill.settings import ENV_PREFIX, cli_flags

BACKENDS = ("triton", "flashinfer", "fa3")
PLUGIN_NAME = "ridgefill"  # the entry point's name in pyproject's sglang.srt.plugins group
# The identity prompts' seeds sit far from the benchmark's pair numbers, so the prompts differ.
IDENTITY_SEED_OFFSET = 10_000


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One server to start: ``command + flags`` with ``env`` set over the inherited environment, whose
    ``RIDGEFILL_*`` variables are dropped (a RidgeFill server gets its settings from ``flags``)."""

    backend: str
    ridgefill: bool
    command: tuple[str, ...]
    flags: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def name(self) -> str:
        return f"{'ridgefill' if self.ridgefill else 'stock'}-{self.backend}"

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX) and k != "SGLANG_PLUGINS"}
        env.update(self.env)
        return env

    def command_line(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return " ".join([env, *self.command, *self.flags]).strip()


@dataclasses.dataclass(frozen=True)
class ServerCheckConfig:
    """What the server tier runs; ``server_args`` are appended to every server's flags."""

    model_path: pathlib.Path
    maps_path: pathlib.Path
    backends: tuple[str, ...] = BACKENDS
    lengths: tuple[int, ...] = (8192, 16384, 32768)
    pairs: int = 3
    warmup: int = 1
    split: int = 12
    tail: int = 4096
    rows_policy: str | None = "llama-3.1-8b-rows"  # measured beside the bare fill; None: the bare fill only
    identity_prompts: int = 3
    identity_length: int = 2048
    identity_tokens: int = 16
    server_args: tuple[str, ...] = ()
    python: str = sys.executable
    request_timeout: float = 1800.0
    startup_timeout: float = 1800.0
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in BACKENDS]
        if unknown or not self.backends:
            raise ValueError(f"--backends must name some of {', '.join(BACKENDS)}, got {','.join(self.backends)!r}")


Launcher = Callable[[ServerSpec], ContextManager[str]]


def stock_plugins() -> str:
    """``SGLANG_PLUGINS`` for a stock server: every installed general plugin but this one (SGLang loads all
    of them when the variable is empty, so an empty list is spelled with a name no plugin has)."""
    from importlib.metadata import entry_points

    others = sorted({ep.name for ep in entry_points(group="sglang.srt.plugins")} - {PLUGIN_NAME})
    return ",".join(others) or "none"


def server_specs(cfg: ServerCheckConfig, backend: str, *, plugins: str | None = None) -> tuple[ServerSpec, ServerSpec]:
    """The stock and the RidgeFill server of one backend."""
    command = (cfg.python, "-m", "sglang.launch_server")
    common = ("--model-path", str(cfg.model_path), "--attention-backend", backend, "--skip-tokenizer-init",
              *cfg.server_args)
    stock = ServerSpec(backend, False, command, common, {"SGLANG_PLUGINS": plugins or stock_plugins()})
    settings = {"prefill_backend": "ridgefill", "maps": str(cfg.maps_path), "split": cfg.split, "tail": cfg.tail}
    if cfg.rows_policy is not None:
        settings["request_policies"] = f"{cfg.rows_policy},plain"
    rf_flags = cli_flags(settings)
    return stock, ServerSpec(backend, True, command, (*common, *rf_flags), {})


def bench_config(cfg: ServerCheckConfig, dims: ModelDims) -> BenchConfig:
    """The benchmark of the RidgeFill server: the rows policy beside the bare fill, or the bare fill alone."""
    if cfg.rows_policy is None:
        return BenchConfig(lengths=cfg.lengths, vocab_size=dims.vocab_size, pairs=cfg.pairs, split=cfg.split,
                           tail=cfg.tail, seed=cfg.seed, warmup=cfg.warmup)
    from sgl_ridgefill.bench.cli import load_bench_policy, selector_flops

    policy = load_bench_policy(cfg.rows_policy, dims)
    split = cfg.split  # the server's --ridgefill-split, which overrides the policy's
    return BenchConfig(
        lengths=cfg.lengths, vocab_size=dims.vocab_size, pairs=cfg.pairs, split=split, tail=cfg.tail, seed=cfg.seed,
        warmup=cfg.warmup, rf_params={"policy": cfg.rows_policy, "split": split, "tail": cfg.tail},
        bare_params={"policy": "plain", "split": split, "tail": cfg.tail}, policy=cfg.rows_policy,
        selector_flops={n: selector_flops(policy, dims, n, split, cfg.tail) for n in cfg.lengths},
    )


@contextlib.contextmanager
def subprocess_launcher(spec: ServerSpec, *, timeout: float = 1800.0, log_dir: pathlib.Path | None = None) -> Iterator[str]:
    """Start ``spec`` as a subprocess, wait for ``/health``, yield its URL, stop it afterwards."""
    from sgl_ridgefill.cpu.launch_server_process import running_server

    log = log_dir / f"{spec.name}.log" if log_dir is not None else None
    env = spec.environment(os.environ)
    with running_server(list(spec.flags), command=list(spec.command), env=env, timeout=timeout, log_path=log) as url:
        yield url


def identity_answers(client: BenchClient, prompts: Sequence[list[int]], cfg: ServerCheckConfig,
                     custom_params: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Greedy answers (output ids and output logprobs) to ``prompts``, the radix cache flushed before each."""
    answers = []
    for ids in prompts:
        client.flush_cache()
        sampling: dict[str, Any] = {"max_new_tokens": cfg.identity_tokens, "temperature": 0.0}
        if custom_params is not None:
            sampling["custom_params"] = dict(custom_params)
        out = client.generate({"input_ids": ids, "sampling_params": sampling, "return_logprob": True})
        meta = out.get("meta_info") or {}
        answers.append({"output_ids": out.get("output_ids"), "output_token_logprobs": meta.get("output_token_logprobs")})
    return answers


def compare_answers(stock: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where ``other`` differs from ``stock``, one line per differing prompt (empty: identical)."""
    lines = []
    for i, (a, b) in enumerate(zip(stock, other)):
        for key in ("output_ids", "output_token_logprobs"):
            if a.get(key) != b.get(key):
                lines.append(f"prompt {i}: {key} differ: stock {str(a.get(key))[:200]} vs RidgeFill off {str(b.get(key))[:200]}")
    if len(stock) != len(other):
        lines.append(f"{len(stock)} stock answers but {len(other)} RidgeFill-off answers")
    return lines


def stock_ttft(client: BenchClient, cfg: ServerCheckConfig, vocab_size: int) -> dict[str, list[float]]:
    """TTFT of the benchmark's prompts on the stock server (after ``warmup`` untimed requests): length -> seconds."""
    for w in range(cfg.warmup):
        client.flush_cache()
        client.time_generate(make_prompt(cfg.lengths[0], vocab_size, cfg.seed, -1 - w), None)
    out: dict[str, list[float]] = {}
    for length in cfg.lengths:
        for pair in range(cfg.pairs):
            client.flush_cache()
            out.setdefault(str(length), []).append(client.time_generate(make_prompt(length, vocab_size, cfg.seed, pair), None).seconds)
    return out


def run_server_check(
    cfg: ServerCheckConfig, launcher: Launcher, *, say: Callable[[str], None] = print,
    on_backend: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every backend's two servers; returns the report (``backends``: backend -> results or error)."""
    config = json.loads((cfg.model_path / "config.json").read_text())
    dims = ModelDims.from_hf_config(config, source=str(cfg.model_path))
    longest = max(*cfg.lengths, cfg.identity_length) + cfg.identity_tokens
    if config.get("max_position_embeddings", longest) < longest:
        raise ValueError(
            f"the model in {cfg.model_path} takes {config['max_position_embeddings']} positions, fewer than the longest "
            f"request ({longest} tokens): shorten --lengths or use a model with a longer context"
        )
    prompts = [make_prompt(cfg.identity_length, dims.vocab_size, cfg.seed, IDENTITY_SEED_OFFSET + i)
               for i in range(cfg.identity_prompts)]
    bench = bench_config(cfg, dims)
    plugins = stock_plugins()
    report: dict[str, Any] = {"model": dataclasses.asdict(dims), "backends": {}}
    for backend in cfg.backends:
        stock, ridgefill = server_specs(cfg, backend, plugins=plugins)
        entry: dict[str, Any] = {"commands": {s.name: s.command_line() for s in (stock, ridgefill)}}
        report["backends"][backend] = entry
        try:
            say(f"{stock.name}: starting: {stock.command_line()}")
            with launcher(stock) as url:
                client = BenchClient(url, timeout=cfg.request_timeout)
                stock_answers = identity_answers(client, prompts, cfg, None)
                entry["stock_ttft"] = stock_ttft(client, cfg, dims.vocab_size)
            say(f"{ridgefill.name}: starting: {ridgefill.command_line()}")
            with launcher(ridgefill) as url:
                client = BenchClient(url, timeout=cfg.request_timeout)
                off_answers = identity_answers(client, prompts, cfg, EXACT_PARAMS)
                differences = compare_answers(stock_answers, off_answers)
                entry["identity"] = {"prompts": len(prompts), "identical": not differences, "differences": differences}
                records, summaries = run_bench(client, bench, dims, progress=say)
            entry["summary"] = [s.to_dict() for s in summaries]
            entry["records"] = [dataclasses.asdict(r) for r in records]
            entry["stock_median"] = {n: statistics.median(t) for n, t in entry["stock_ttft"].items()}
        except (ServerError, RuntimeError, TimeoutError, OSError) as error:
            entry["error"] = f"{type(error).__name__}: {error}"
            say(f"{backend}: {entry['error']}")
        if on_backend is not None:
            on_backend(report)
    return report


def server_table(report: Mapping[str, Any]) -> str:
    """Per backend: the identity verdict, then the benchmark's table with the stock median beside it."""
    from sgl_ridgefill.bench.report import format_table
    from sgl_ridgefill.bench.runner import LengthSummary

    lines = []
    for backend, entry in report["backends"].items():
        if "error" in entry:
            lines.append(f"{backend}: error: {entry['error']}")
            continue
        identity = entry["identity"]
        verdict = "identical" if identity["identical"] else f"DIFFERENT ({len(identity['differences'])} differences)"
        lines.append(f"{backend}: RidgeFill off vs stock over {identity['prompts']} prompts: {verdict}")
        fields = {f.name for f in dataclasses.fields(LengthSummary)}
        summaries = [LengthSummary(**{k: (tuple(v) if k == "pair_ratios" else v) for k, v in s.items() if k in fields})
                     for s in entry["summary"]]
        table = format_table(summaries).splitlines()
        stock = entry["stock_median"]
        lines.append(f"{table[0]}  {'stock s':>8}")
        lines += [f"{row}  {stock.get(str(s.length), float('nan')):>8.3f}" for row, s in zip(table[1:], summaries)]
    return "\n".join(lines)
