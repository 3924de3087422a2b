"""Side-by-side timing of a bfloat16 prefill on PyTorch's bfloat16 kernels and through float32 (``cpu/matmul.py``).

``python -m sgl_ridgefill.bench.bf16_matmul --model qwen2.5-coder-0.5b [--tokens 1024] [--pairs 3]`` loads the
model twice in bfloat16 with ``transformers`` (one copy with its projections and LM head routed through
float32), runs the same prompt through each alternately, and prints the best forward time of each, their
ratio, and how far the two copies' logits are apart (largest difference, and the share of positions whose
top token agrees). With ``--float32`` it also times the model in float32 (what bfloat16 costs on this CPU
against the dtype it would pick) and gives each bfloat16 copy's top-token agreement with it (the scale of
bfloat16's own rounding, against which the two copies' difference reads). The CPU capability and whether it has native bfloat16 are printed beside.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import torch

from ..tools import args as argtypes


def main(argv: Sequence[str] | None = None) -> int:
    from ..calibration.capture import load_model
    from ..cpu import matmul
    from ..cpu.dtype import CpuFeatures
    from ..models.fetch import resolve_model

    parser = argtypes.command_parser("sgl_ridgefill.bench.bf16_matmul", __doc__)
    parser.add_argument("--model", required=True, help="a model folder or a `sgl-ridgefill model` name")
    parser.add_argument("--tokens", type=int, default=1024, help="prompt length (default 1024)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs after one warm-up (default 3)")
    parser.add_argument("--float32", action="store_true", help="also time the model in float32")
    args = parser.parse_args(argv)
    features = CpuFeatures.detect()
    if not matmul.through_float32(features):
        parser.error(f"bfloat16 matmuls do not run through float32 here ({features.capability}, "
                     f"native bfloat16: {features.hardware_bf16}); nothing to compare")
    torch.manual_seed(0)
    folder = resolve_model(args.model)
    native, _, config = load_model(folder, "bfloat16")
    for module in native.modules():  # this copy keeps PyTorch's bfloat16 kernels: undo upcast_linears
        vars(module).pop("forward", None)
    routed, _, _ = load_model(folder, "bfloat16")
    models = {"bfloat16 (PyTorch's kernels)": native, "bfloat16 through float32": routed}
    if args.float32:
        models["float32"] = load_model(folder, "float32")[0]
    ids = torch.randint(100, int(config["vocab_size"]) - 100, (1, args.tokens))
    logits: dict[str, torch.Tensor] = {}

    def timed(name: str) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            logits[name] = models[name](ids).logits[0].float()
        return time.perf_counter() - start

    for name in models:  # warm-up
        timed(name)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.pairs):
        for name in models:
            times[name].append(timed(name))
    best = {name: min(t) for name, t in times.items()}
    a, b = logits["bfloat16 (PyTorch's kernels)"], logits["bfloat16 through float32"]
    result = {
        "model": str(folder.name), "tokens": args.tokens, "pairs": args.pairs, "threads": torch.get_num_threads(),
        "cpu_capability": features.capability, "native_bfloat16": features.hardware_bf16,
        "seconds": {name: [round(t, 3) for t in ts] for name, ts in times.items()},
        "speedup_through_float32": round(best["bfloat16 (PyTorch's kernels)"] / best["bfloat16 through float32"], 2),
        "logits_max_abs_diff": round(float((a - b).abs().max()), 4),
        "top1_agreement": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4),
    }
    if args.float32:  # how far each bfloat16 copy is from the float32 model: the scale of bfloat16's own noise
        result["through_float32_over_float32"] = round(best["bfloat16 through float32"] / best["float32"], 2)
        full = logits["float32"]
        result["top1_agreement_with_float32"] = {
            name: round(float((logits[name].argmax(-1) == full.argmax(-1)).float().mean()), 4)
            for name in models if name != "float32"}
    for name, t in best.items():
        print(f"{name:32s} best {t:7.2f} s over {args.tokens} tokens")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
