"""Time the statistics pass against a plain forward pass over the same documents.

    python -m sgl_ridgefill.calibration.benchmark --model qwen2.5-coder-0.5b --splits 12 --docs 8

For each document (its first ``doc_tokens`` tokens) it runs, alternating which goes first so that
machine load drifts evenly: (a) the plain forward of the unmodified decoder over every layer, with no
hooks and no logits (what serving the prompt costs), and (b) the calibration step: capture up to the
last needed layer, accumulation of the residual kind for every split. The accumulation overhead is
(b's accumulation time) / (a's time); the step's total cost relative to (a) is reported beside it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

from .capture import capture_layer_inputs, load_model
from .corpus import open_corpus
from .pipeline import peak_memory_mib
from .stats import SplitStats
from .targets import Accumulator, sink_rule
from sgl_ridgefill.cpu.dtype import CHOICES as DTYPE_CHOICES
from sgl_ridgefill.tools import args as argtypes


def benchmark_pass(
    model: str,
    *,
    corpus: str = "builtin",
    splits: tuple[int, ...] = (12,),
    docs: int = 8,
    doc_tokens: int = 2048,
    dtype: str = "auto",
    seed: int = 0,
) -> dict[str, Any]:
    """Return timings (seconds, tokens/s, overheads) over ``docs`` documents' first ``doc_tokens`` tokens;
    ``dtype`` ``"auto"``: this CPU's (:func:`sgl_ridgefill.cpu.dtype.choose_dtype`)."""
    from sgl_ridgefill.cpu.dtype import choose_dtype
    from sgl_ridgefill.models import resolve_model

    choice = choose_dtype(dtype)
    print(choice.line(), file=sys.stderr, flush=True)
    dtype = choice.dtype
    model_dir = resolve_model(model)
    hf_model, tokenizer, config = load_model(model_dir, dtype)
    num_layers, d = int(config["num_hidden_layers"]), int(config["hidden_size"])
    layers = sorted(set(splits) | set(range(min(splits), num_layers)))
    stats = {s: {"residual": SplitStats.zeros(s, num_layers, d)} for s in splits}
    accumulator = Accumulator(("residual",), {}, sink_rule())
    pieces = []
    for doc in open_corpus(corpus).ordered(seed):
        ids = tokenizer(doc.text(), add_special_tokens=True, verbose=False)["input_ids"][:doc_tokens]
        if len(ids) >= doc_tokens // 2:
            pieces.append(torch.tensor(ids))
        if len(pieces) == docs:
            break
    base = getattr(hf_model, "model", hf_model)
    with torch.no_grad():
        base(input_ids=pieces[0][None, :64], use_cache=False)  # warm-up: allocator, kernels
    plain = capture = accumulate = 0.0
    for i, ids in enumerate(pieces):
        for step in (("plain", "calib") if i % 2 == 0 else ("calib", "plain")):
            start = time.perf_counter()
            if step == "plain":
                with torch.no_grad():
                    base(input_ids=ids[None], use_cache=False)
                plain += time.perf_counter() - start
            else:
                states = capture_layer_inputs(hf_model, ids, layers)
                middle = time.perf_counter()
                for s in splits:
                    accumulator.add(states, s, stats[s])
                del states
                capture += middle - start
                accumulate += time.perf_counter() - middle
    tokens = int(sum(p.numel() for p in pieces))
    return {
        "model": str(model_dir),
        "splits": list(splits),
        "documents": len(pieces),
        "tokens": tokens,
        "plain_forward_s": round(plain, 6),
        "capture_s": round(capture, 6),
        "accumulate_s": round(accumulate, 6),
        "plain_tokens_per_s": round(tokens / plain, 1),
        "calibration_tokens_per_s": round(tokens / (capture + accumulate), 1),
        "accumulate_overhead": round(accumulate / plain, 4),
        "calibration_vs_plain": round((capture + accumulate) / plain, 4),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "peak_memory_mib": round(peak_memory_mib(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argtypes.command_parser("sgl_ridgefill.calibration.benchmark", __doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--corpus", default="builtin")
    parser.add_argument("--splits", type=argtypes.layers, default=(12,), help="comma-separated")
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="default auto: bfloat16 where this CPU has native bfloat16 matmuls, else float32")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    try:
        result = benchmark_pass(args.model, corpus=args.corpus, splits=args.splits,
                                docs=args.docs, doc_tokens=args.doc_tokens, dtype=args.dtype)
    except ValueError as exc:
        print(f"benchmark: error: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
