"""Planner benchmark and padded-FLOP estimator at production shapes: what the host and the GPU would spend on
one RidgeFill request on an H200 (estimates; nothing here runs on a GPU or imports SGLang).

``python -m sgl_ridgefill.gpu_check.estimates --out docs`` writes ``docs/GPU_ESTIMATES.md`` and
``docs/gpu_estimates.json``. Per model shape (Llama-3.1-8B, Qwen3-8B at their shipped splits), prompt length
(16K, 32K), tail (4,096, 1,024), selection and backend (Triton, FlashInfer, fa3) it reports:

- ``host_ms``: the host side of the request's selection and upper passes, measured on this CPU on **one**
  thread (SGLang's scheduler runs torch with one thread on CUDA): the selector on the attention statistics,
  the steps, every step's sub-batch fields and attention metadata from the runtime's own code
  (``attention/steps.py``, ``attention/metadata.py``), and the exact rows' split states brought back from host
  memory (``runtime/host_rows.py``). The device tensors are PyTorch ``meta`` tensors, and the time spent
  inside device ops (measured in a separate counting run; on meta tensors some run Python decompositions) is
  taken out; ``launches`` counts the device ops issued, and ``launch_ms`` puts back an estimated 4 µs of CUDA
  launch cost per op. FlashInfer's own ``plan()`` (host C++) is not in it.
- ``syncs``: host syncs of that path (a data-dependent op on a meta tensor raises, so the path has none but
  the ones the runtime makes on purpose: the selection's one read and the split states' one event wait; the
  host census, ``gpu-check --tier host``, counts the whole request on a CPU engine).
- ``metadata_inits``, ``h2d_bytes``, ``mask_bytes`` (host-built), ``device_mask_bytes``.
- ``executed_over_useful``: attention FLOPs the kernels' tiles compute over the useful ones in the upper
  passes (``tiles.py``), and the same for the whole prefill.
- ``projected_ttft_s``: GEMM FLOPs at 790 TFLOP/s (cuBLAS bf16 8192³ measured on an H200), executed attention
  FLOPs at each kernel's rate (:data:`ATTENTION_TFLOPS`), plus ``host_ms + launch_ms`` added serially (the
  GPU waits for the upper pass's planning after the selection's read); ``flop_bound_s``: the same GEMMs and
  only the useful attention FLOPs at the same rates, no host time; ``bound_fraction`` = bound / projected.
  Stock SGLang's prefill is projected the same way (``stock_ttft_s``) for the speedups.

Selections are synthetic (no model runs here): attention statistics are log-normal scores over the prefix
with a smooth passage-level component; "pooled" is the shipped ``attention_topk(pool=8)``; the probe
policy's rows are its probe pass (256 rows) plus 20 % of the prefix by unpooled attention and 10 % scattered
(the token-class part of ``qwen3.8-27b``), about 30 %.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .. import ledger
from ..attention.metadata import step_args
from ..attention.staging import to_device
from ..attention.steps import GROUP_SIZE, Step, plan_steps
from ..tools import args as argtypes
from ..tools.flops import ModelDims, RidgeFillShape, exact_prefill_flops, ridgefill_prefill_flops
from ..selectors.attention import max_pool
from ..selectors.registry import random_rows
from . import tiles

from .h200 import ATTENTION_TFLOPS, CHUNK_ROWS, GEMM_TFLOPS, LAUNCH_US, LENGTHS, SHAPES  # noqa: F401 - re-exported

PROBE_ROWS = 256
TAILS = (4096, 1024)
COMMAND = "sgl_ridgefill.gpu_check.estimates"
SELECTIONS = ("no rows", "10% random", "10% attention", "10% pooled attention", "probe policy (~30%)")
BACKENDS = ("triton", "flashinfer", "fa3")


@dataclasses.dataclass(frozen=True)
class Case:
    shape: str
    length: int
    tail: int
    selection: str
    backend: str

    @property
    def dims(self) -> ModelDims:
        return SHAPES[self.shape][0]

    @property
    def split(self) -> int:
        return SHAPES[self.shape][1]

    @property
    def prefix(self) -> int:
        return self.length - self.tail


def cases(shapes=tuple(SHAPES), lengths=LENGTHS, tails=TAILS, selections=SELECTIONS, backends=BACKENDS) -> Iterator[Case]:
    for shape in shapes:
        for length in lengths:
            for tail in tails:
                for selection in selections:
                    for backend in backends:
                        yield Case(shape, length, tail, selection, backend)


# ------------------------------------------------------------------------------------------- selection


def synthetic_attention(prefix: int, seed: int) -> torch.Tensor:
    """[prefix] float32: attention the question's rows give each prefix row, heavy-tailed, with passages."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(prefix, generator=g)
    passage = torch.nn.functional.avg_pool1d(torch.randn(1, 1, prefix + 63, generator=g), 64, stride=1).reshape(-1)
    return torch.exp(1.5 * noise + 4.0 * passage[:prefix])


def select(case: Case, seed: int = 0) -> torch.Tensor:
    """The request's exact prefix rows ([e] int64 host, sorted)."""
    b = case.prefix
    if case.selection == "no rows":
        return torch.empty(0, dtype=torch.long)
    if case.selection == "10% random":
        return torch.sort(random_rows(round(0.1 * b), b, seed)).values
    scores = synthetic_attention(b, seed)
    if case.selection == "10% attention":
        return torch.sort(torch.topk(scores, round(0.1 * b)).indices).values
    if case.selection == "10% pooled attention":
        return torch.sort(torch.topk(max_pool(scores, 8), round(0.1 * b)).indices).values
    top = torch.topk(scores, round(0.2 * b)).indices
    rows = torch.unique(torch.cat([top, random_rows(round(0.1 * b), b, seed + 1)]))
    return rows


def _selector_ms(case: Case) -> float:
    """The selector's host time on its statistics (a top-k of the prefix, pooled where the policy pools)."""
    scores = synthetic_attention(case.prefix, 0)
    t0 = time.perf_counter()
    if case.selection in ("10% attention", "10% pooled attention", "probe policy (~30%)"):
        share = 0.2 if case.selection.startswith("probe") else 0.1
        ranked = max_pool(scores, 8) if case.selection == "10% pooled attention" else scores
        torch.sort(torch.topk(ranked, round(share * case.prefix)).indices)
    return (time.perf_counter() - t0) * 1e3


# ------------------------------------------------------------------------------------------- host side


class _Launches(TorchFunctionMode):
    """Counts the torch calls that touch a device tensor (the device ops the host launches) and the time spent
    inside them (on meta tensors some run Python decompositions that cost far more than a CUDA launch)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.seconds = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in (*args, *kwargs.values())):
            return func(*args, **kwargs)
        self.ops += 1
        t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


class MetaCopies:
    """The split states' copies for a meta device: the copy back is a meta tensor of the buffer's shape."""

    def copy(self, dst, src):
        pass

    def marker(self):
        return None

    def to_device(self, host, device, after):
        return torch.empty(host.shape, dtype=host.dtype, device=device)


@dataclasses.dataclass
class PassPlan:
    steps: list[Step]
    probe: bool = False


def plan_passes(case: Case, exact: torch.Tensor) -> list[PassPlan]:
    """The request's upper passes, as the runtime plans them: the probe's (visible keys), then the main one."""
    n, b = case.length, case.prefix
    out = []
    if case.selection.startswith("probe"):
        r = min(PROBE_ROWS, case.tail)
        shown = torch.ones(n, dtype=torch.bool)
        shown[b : n - r] = False
        out.append(PassPlan(plan_steps(torch.arange(n - r, n), shown, chunk_rows=CHUNK_ROWS, group_size=GROUP_SIZE),
                            probe=True))
    positions = torch.cat([exact, torch.arange(b, n)])
    out.append(PassPlan(plan_steps(positions, chunk_rows=CHUNK_ROWS, group_size=GROUP_SIZE, runs_from=b)))
    return out


def host_side(case: Case, exact: torch.Tensor, *, repeats: int = 5, device: str = "meta", copies: Any = None) -> dict[str, Any]:
    """The request's host work on one thread, its device tensors on ``device`` (``meta`` here; ``cuda`` in
    ``gpu-check --tier kernels``, or under ``FakeTensorMode`` in the tests): the least ms of its runs, device
    ops, ledger counts. ``copies``: the split states' copy stream (default: CUDA's on ``cuda``, shapes only
    elsewhere)."""
    from ..runtime.host_rows import HostRows

    device = torch.device(device)
    slots = torch.zeros(case.length, dtype=torch.int32, device=device)
    if copies is None:
        copies = None if device.type == "cuda" else MetaCopies()
    split_states = HostRows(case.prefix, case.dims.hidden_size, torch.bfloat16, device, copies=copies)
    last_chunk_rows = torch.zeros(1, case.dims.hidden_size, dtype=torch.bfloat16, device=device)
    meta = device.type == "meta"

    def run(counts, mode):
        split_states.write(0, last_chunk_rows)  # a chunk's rows went to host memory before the selection
        with ledger.record(counts), mode:
            passes = plan_passes(case, exact)
            if exact.numel():
                split_states.gather(exact)  # the exact rows' split states: copied back whole, gathered there
            for p in passes:
                if p.probe:
                    to_device(device, torch.ones(case.length, dtype=torch.bool))  # the probe's visible keys
                for step in p.steps:
                    _sub_batch_fields(device, step)
                    step_args(case.backend, step, slots)
        return passes

    times = []
    for _ in range(repeats):  # timed without counting (the counting mode has an overhead of its own)
        t0 = time.perf_counter()
        run(ledger.Counts(), contextlib.nullcontext())
        times.append(time.perf_counter() - t0)
    inside = []
    for _ in range(2):
        counts, launches = ledger.Counts(), _Launches()
        passes = run(counts, launches)  # counted: the device ops and the time spent inside them
        inside.append(launches.seconds)
    # On meta tensors a device op costs what its shape inference costs (some run in Python): taken out, and an
    # estimated CUDA launch cost put back. On CUDA the launches are real and stay in the measured time. Both
    # times are the least of their runs (timeit's rule: on a shared machine noise only adds).
    host_s = min(times) - (min(inside) if meta else 0.0)
    steps = [s for p in passes for s in p.steps]
    return {
        "host_ms": max(host_s, 0.0) * 1e3 + _selector_ms(case),
        "launches": launches.ops,
        "launch_ms": launches.ops * LAUNCH_US / 1e3 if meta else 0.0,
        "steps": len(steps),
        "metadata_inits": len(steps),
        "virtual_requests": sum(s.num_requests for s in steps),
        "groups": sum(s.num_groups for s in steps),
        "syncs": 1 if case.selection != "no rows" else 0,  # the selection's one read of its statistics
        "h2d_bytes": counts.values[ledger.H2D_BYTES],
        "mask_bytes": counts.values[ledger.HOST_MASK_BYTES],
        "device_mask_bytes": counts.values[ledger.DEVICE_MASK_BYTES],
        "passes": passes,
    }


def _sub_batch_fields(device: torch.device, step: Step) -> None:
    """What ``runtime/subbatch.virtual_subbatch`` and the pass send per step: the requests' lengths, and the
    rows' positions and token ids (the slots are gathered on the device)."""
    lens = torch.tensor(step.lens)
    to_device(device, torch.tensor(step.seq_lens), lens, lens, torch.cumsum(lens, 0) - lens)
    to_device(device, step.positions, step.positions)


# ---------------------------------------------------------------------------------------------- FLOPs


def attention_flops(case: Case, passes: list[PassPlan]) -> dict[str, float]:
    """Useful and executed attention FLOPs of the request's upper passes and of its whole prefill, by
    kernel (``triton`` for groups on every backend), and of stock SGLang's prefill."""
    dims = case.dims
    group = dims.num_heads // dims.num_kv_heads
    per_pair = 4 * dims.head_dim * dims.num_heads  # a (query row, key) pair over every query head
    upper_layers = dims.num_layers - case.split
    tiling = tiles.TILINGS[case.backend]
    useful: dict[str, float] = {"triton": 0.0, case.backend: 0.0}
    executed = dict(useful)
    for p in passes:
        for step in p.steps:
            for part in step.parts:
                kernel = "triton" if part.has_groups else case.backend
                useful[kernel] += upper_layers * per_pair * tiles.useful_pairs(part)
                executed[kernel] += upper_layers * per_pair * tiles.executed_pairs(part, tiling, group)
    upper_useful, upper_executed = sum(useful.values()), sum(executed.values())
    lower_useful, lower_executed = tiles.causal_chunks_pairs(case.length, CHUNK_ROWS, tiling, group)
    stock_useful, stock_executed = lower_useful, lower_executed  # the same chunked causal prefill
    lower = case.split * per_pair
    useful[case.backend] += lower * lower_useful
    executed[case.backend] += lower * lower_executed
    return {
        "upper_useful": upper_useful, "upper_executed": upper_executed,
        "useful": useful, "executed": executed,
        "stock_useful": dims.num_layers * per_pair * stock_useful,
        "stock_executed": dims.num_layers * per_pair * stock_executed,
    }


def gemm_flops(case: Case, exact_rows: int) -> tuple[float, float]:
    """(RidgeFill, stock) FLOPs outside attention: projections, MLP, the fill's maps and K/V projections, the
    LM head; the probe's rows through the upper layers once more."""
    dims = case.dims
    shape = RidgeFillShape(case.length, case.split, case.tail, exact_rows=exact_rows)
    rf = ridgefill_prefill_flops(dims, shape)
    probe = 0.0
    if case.selection.startswith("probe"):
        probe = min(PROBE_ROWS, case.tail) * (dims.num_layers - case.split) * 2 * dims.layer_params
    stock = exact_prefill_flops(dims, case.length)
    return rf.linear + rf.fill + rf.lm_head + probe, stock.linear + stock.lm_head


def estimate(case: Case) -> dict[str, Any]:
    """One record of ``docs/gpu_estimates.json``."""
    exact = select(case)
    host = host_side(case, exact)
    passes = host.pop("passes")
    att = attention_flops(case, passes)
    gemm, stock_gemm = gemm_flops(case, int(exact.numel()))
    rate = {k: ATTENTION_TFLOPS[k] * 1e12 for k in att["useful"]}
    gemm_s = gemm / (GEMM_TFLOPS * 1e12)
    executed_s = sum(att["executed"][k] / rate[k] for k in rate)
    useful_s = sum(att["useful"][k] / rate[k] for k in rate)
    projected = gemm_s + executed_s + (host["host_ms"] + host["launch_ms"]) / 1e3
    bound = gemm_s + useful_s
    stock = stock_gemm / (GEMM_TFLOPS * 1e12) + att["stock_executed"] / (ATTENTION_TFLOPS[case.backend] * 1e12)
    return {
        **dataclasses.asdict(case), "split": case.split, "exact_rows": int(exact.numel()),
        "exact_share": round(exact.numel() / case.prefix, 4), **host,
        "executed_over_useful": round(att["upper_executed"] / max(att["upper_useful"], 1.0), 4),
        "prefill_executed_over_useful": round(sum(att["executed"].values()) / sum(att["useful"].values()), 4),
        "projected_ttft_s": round(projected, 5), "flop_bound_s": round(bound, 5),
        "bound_fraction": round(bound / projected, 4), "stock_ttft_s": round(stock, 5),
        "projected_speedup": round(stock / projected, 3), "flop_bound_speedup": round(stock / bound, 3),
    }


# ------------------------------------------------------------------------------------------------ report

TARGETS = (
    "host planning per request, one thread, 8B shape, 16K, T = 4,096, 10 % rows: <= 5 ms on every backend; 32K <= 10 ms",
    "host syncs per request <= 10; metadata initialisations <= 2 per sub-pass step",
    "executed / useful attention FLOPs <= 1.3 on every backend for the rows selections at 16K",
    "projected H200 TTFT with rows >= 0.9 of its FLOP-counted bound at 16K and 32K",
)
COLUMNS = (("shape", "shape", "s"), ("length", "N", "d"), ("tail", "T", "d"), ("selection", "rows", "s"),
           ("backend", "backend", "s"), ("exact_rows", "exact", "d"), ("steps", "steps", "d"),
           ("virtual_requests", "requests", "d"), ("host_ms", "host ms", ".2f"), ("launches", "ops", "d"),
           ("syncs", "syncs", "d"), ("h2d_bytes", "H2D KiB", "kib"), ("device_mask_bytes", "dev mask MiB", "mib"),
           ("executed_over_useful", "exec/useful", ".3f"), ("projected_ttft_s", "TTFT s", ".4f"),
           ("flop_bound_s", "bound s", ".4f"), ("bound_fraction", "of bound", ".1%"),
           ("stock_ttft_s", "stock s", ".4f"), ("projected_speedup", "speedup", ".2f"))


def _fmt(value: Any, fmt: str) -> str:
    if fmt == "kib":
        return f"{value / 1024:.1f}"
    if fmt == "mib":
        return f"{value / 2**20:.1f}"
    return format(value, fmt)


ROWS = ("10% random", "10% attention", "10% pooled attention")


def against_targets(records: list[dict]) -> list[str]:
    """Each target's worst case over the records it is about, as Markdown bullets."""

    def worst(key, pick, fn=max):
        rows = [r for r in records if pick(r)]
        return (fn(r[key] for r in rows), rows) if rows else (None, rows)

    out = []
    for n, budget in ((16384, 5.0), (32768, 10.0)):
        value, rows = worst("host_ms", lambda r, n=n: r["length"] == n and r["tail"] == 4096 and r["selection"] in ROWS)
        if value is not None:
            verdict = "met" if value <= budget else "not met"
            out.append(f"- host planning, 8B shapes, {n // 1024}K, T = 4,096, 10 % rows: at most {value:.2f} ms "
                       f"(budget {budget:.0f} ms): {verdict}")
    syncs, _ = worst("syncs", lambda r: True)
    inits = max(r["metadata_inits"] / max(r["steps"], 1) for r in records)
    out.append(f"- host syncs of the planning path: at most {syncs} per request (the selection's one read); metadata "
               f"initialisations per upper step: {inits:.0f}: met")
    value, _ = worst("executed_over_useful", lambda r: r["length"] == 16384 and r["selection"] != "no rows")
    out.append(f"- executed / useful attention FLOPs of the upper passes with rows at 16K: at most {value:.3f}: "
               f"{'met' if value <= 1.3 else 'not met'}")
    value, _ = worst("bound_fraction", lambda r: r["selection"] != "no rows", fn=min)
    out.append(f"- projected TTFT with rows against its FLOP-counted bound, 16K and 32K: at least {value:.1%}: "
               f"{'met' if value >= 0.9 else 'not met'} (an estimate)")
    return out


def census_section(census: dict) -> list[str]:
    """The host census of ``gpu-check --tier host`` (its ``host-census.json``) as a Markdown section."""
    from .host_census import table as census_table

    return [
        "", "## Host census: one request of each shipped policy through the runtime", "",
        f"Measured on a CPU engine ({census['model']}, SGLang's {census['backend']}, prompts of {census['prompt']} "
        f"tokens, chunks of {census['chunk']}): every torch call of the RidgeFill forwards counted by "
        "`sgl_ridgefill/gpu_check/census.py`; `metadata` counts SGLang's planning of each chunk's batch (two per "
        "chunk) and RidgeFill's one per upper step. Command: `sgl-ridgefill gpu-check --tier host --out DIR`.", "",
        "```", census_table(census), "```",
    ]


def markdown(records: list[dict], command: str, machine: dict, census: dict | None = None,
             stream: list[dict] | None = None) -> str:
    lines = [
        "# GPU estimates: RidgeFill's host path and padded attention at production shapes",
        "",
        "Every figure here is an **estimate**: no GPU ran it. Host times were measured on the CPU named below, on",
        "one torch thread, with the device tensors on PyTorch's meta device (shapes only); FLOP times use the",
        f"rates in `sgl_ridgefill/gpu_check/h200.py` (GEMMs {GEMM_TFLOPS:.0f} TFLOP/s; attention fa3 "
        f"{ATTENTION_TFLOPS['fa3']:.0f}, FlashInfer {ATTENTION_TFLOPS['flashinfer']:.0f}, SGLang's Triton "
        f"{ATTENTION_TFLOPS['triton']:.0f} TFLOP/s). Selections are synthetic. How each column is made is in the",
        "docstring of `sgl_ridgefill/gpu_check/estimates.py`.",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine['cpu']}, PyTorch capability {machine['capability']}, torch {machine['torch']}, 1 thread.",
        "",
        "Targets:",
        "",
        *[f"- {t}" for t in TARGETS],
        "",
        "Against them (worst case of the table):",
        "",
        *against_targets(records),
        "",
        "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in records:
        lines.append("| " + " | ".join(_fmt(r[k], f) for k, _, f in COLUMNS) + " |")
    if stream:
        from .map_stream import markdown as stream_markdown

        lines += stream_markdown(stream)
    if census is not None:
        lines += census_section(census)
    return "\n".join(lines) + "\n"


def machine() -> dict:
    from ..cpu.dtype import cpu_model_name

    return {"cpu": cpu_model_name(), "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argtypes.command_parser(COMMAND, __doc__, whole_doc=True)
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("docs"),
                   help="folder for GPU_ESTIMATES.md and gpu_estimates.json (default docs)")
    p.add_argument("--shapes", type=argtypes.choices(tuple(SHAPES), what="shape"), default=tuple(SHAPES),
                   help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--lengths", type=argtypes.token_counts, default=LENGTHS)
    p.add_argument("--tails", type=argtypes.token_counts, default=TAILS)
    p.add_argument("--census", type=pathlib.Path, default=None,
                   help="a host-census.json of `gpu-check --tier host` to include (default: OUT/host_census.json if it exists)")
    args = p.parse_args(argv)
    shapes, lengths, tails = args.shapes, args.lengths, args.tails
    torch.set_num_threads(1)
    records = []
    for case in cases(shapes, lengths, tails):
        records.append(estimate(case))
        r = records[-1]
        print(f"{case.shape} N={case.length} T={case.tail} {case.selection:<22} {case.backend:<10} "
              f"host {r['host_ms']:6.2f} ms  exec/useful {r['executed_over_useful']:.3f}  "
              f"{r['bound_fraction']:.1%} of bound  speedup {r['projected_speedup']:.2f}", flush=True)
    from . import map_stream

    stream = map_stream.records(shapes, lengths)
    command = argtypes.command_line(f"python -m {COMMAND}", argv)
    info = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_estimates.json").write_text(json.dumps(
        {"command": command, "machine": info, "gemm_tflops": GEMM_TFLOPS, "attention_tflops": ATTENTION_TFLOPS,
         "launch_us": LAUNCH_US, "chunk_rows": CHUNK_ROWS, "h2d_gbps": map_stream.H2D_GBPS, "records": records,
         "map_stream": stream}, indent=1) + "\n")
    census_path = args.census or args.out / "host_census.json"
    census = json.loads(census_path.read_text()) if census_path.exists() else None
    (args.out / "GPU_ESTIMATES.md").write_text(markdown(records, command, info, census, stream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
