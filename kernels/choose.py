"""Which backend applies the maps of one shape on one device: measured at startup, never assumed.

Whether the project's Triton map kernel or cuBLAS (``torch.addmm``) is faster depends on the GPU, the map's
shape and dtype, and the Triton version. So the maps store asks :func:`fastest_map_backend` once per (map
dtype, row dtype, ``d_in``, ``d_out``, int8 group size). On CUDA it runs every candidate of
:data:`CANDIDATES` on representative row counts (:data:`DEFAULT_ROWS`: the filled rows of a prefill chunk),
checks each against float64 arithmetic on the first rows, and keeps the one with the smallest total
time. A candidate that raises (a kernel that does not compile, say) or disagrees is dropped; with none left
the reference is used. On a CPU the candidates are the float32 reference and ``torch.addmm`` in the rows'
half dtype, which runs on the CPU's native bfloat16 units where it has them (measured: 5x faster with AMX)
and much slower where it does not; float32 rows on a CPU (where both are the same addmm) and other devices
get the reference without measuring. The choice and every timing are logged, and measured choices are
cached per process.

Engine-free: imports torch (and triton only through the Triton candidate).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import torch

from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8
from sgl_ridgefill.kernels.quant import dequantize_int8_groupwise, quantize_int8_groupwise
from sgl_ridgefill.kernels.timing import median_ms

logger = logging.getLogger(__name__)

# Per device type; order breaks ties: cuBLAS first on CUDA, the reference first on a CPU.
CANDIDATES = {"cuda": ("torch", "triton"), "cpu": ("reference", "torch")}
DEFAULT_ROWS = (2048, 8192)
CHECK_ROWS = 256
# Worst |candidate - float64| relative to the largest exact entry, by the rows' dtype: accumulation
# order only for float32; one rounding step of the output format near its top for half outputs. The Triton
# kernel tests hold the kernels to the same bounds.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# (backend, rows) -> median milliseconds; raises when the backend cannot run or disagrees with float64.
Timer = Callable[[str, int], float]


@dataclasses.dataclass(frozen=True)
class MapBackendChoice:
    """The backend for one map shape and what it was chosen from.

    ``ms``: candidate -> rows -> median milliseconds (empty when nothing was measured);
    ``failed``: candidate -> why it was dropped.
    """

    backend: str
    shape: str
    ms: Mapping[str, Mapping[int, float]]
    failed: Mapping[str, str]

    def describe(self) -> str:
        """One log line: the choice, then every candidate's timings or failure."""
        if not self.ms and not self.failed:
            return f"map backend for {self.shape}: {self.backend} (nothing to measure for these rows on this device)"
        parts = []
        for name, by_rows in self.ms.items():
            times = ", ".join(f"{t:.3f} ms @{rows}" for rows, t in by_rows.items())
            parts.append(f"{name} {times} (total {sum(by_rows.values()):.3f} ms)")
        parts += [f"{name} dropped: {why}" for name, why in self.failed.items()]
        return f"map backend for {self.shape}: {self.backend}; " + "; ".join(parts)


def choose_from_timings(ms: Mapping[str, Mapping[int, float]], device_type: str = "cuda") -> str:
    """The candidate with the smallest total time over the row counts (the first of the device's
    :data:`CANDIDATES` on a tie); ``"reference"`` when there is none."""
    if not ms:
        return "reference"
    order = {name: i for i, name in enumerate(CANDIDATES.get(device_type, ()))}
    return min(ms, key=lambda name: (sum(ms[name].values()), order.get(name, len(order))))


def fastest_map_backend(
    map_dtype: torch.dtype,
    d_in: int,
    d_out: int,
    *,
    device: torch.device | str,
    x_dtype: torch.dtype | None = None,
    group_size: int | None = None,
    rows: tuple[int, ...] = DEFAULT_ROWS,
    repeats: int = 5,
    timer: Timer | None = None,
) -> MapBackendChoice:
    """The faster of :data:`CANDIDATES` for ``[rows, d_in] -> [rows, d_out]`` maps on ``device``.

    ``map_dtype``: the maps' dtype (``torch.int8`` for group-wise int8 maps, with ``group_size``);
    ``x_dtype``: the rows' dtype (default: ``map_dtype``, bfloat16 for int8 maps). ``timer`` replaces the
    measurement (tests): it is called for every candidate and row count, on any device.
    """
    if (map_dtype == torch.int8) != (group_size is not None):
        raise ValueError(f"fastest_map_backend: group_size is for int8 maps only, got {map_dtype} with {group_size!r}")
    x_dtype = x_dtype or (torch.bfloat16 if map_dtype == torch.int8 else map_dtype)
    device = torch.device(device)
    grouped = f" (groups of {group_size})" if group_size is not None else ""
    shape = f"{_name(map_dtype)} maps {d_in}->{d_out}{grouped}, {_name(x_dtype)} rows"
    if timer is None and (device.type not in CANDIDATES or (device.type == "cpu" and x_dtype == torch.float32)):
        return MapBackendChoice("reference", shape, {}, {})
    key = (str(device), map_dtype, x_dtype, d_in, d_out, group_size, tuple(rows), repeats)
    if timer is None and key in _MEASURED:
        return _MEASURED[key]
    measure = timer or measuring_timer(map_dtype, x_dtype, d_in, d_out, group_size, device, repeats)
    ms: dict[str, dict[int, float]] = {}
    failed: dict[str, str] = {}
    for name in CANDIDATES.get(device.type, CANDIDATES["cuda"]):
        try:
            ms[name] = {n: float(measure(name, n)) for n in rows}
        except Exception as error:  # a candidate that cannot run is dropped, not fatal
            failed[name] = f"{type(error).__name__}: {str(error)[:300]}"
    choice = MapBackendChoice(choose_from_timings(ms, device.type), shape, ms, failed)
    logger.info("%s", choice.describe())
    if timer is None:
        _MEASURED[key] = choice
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the measurement's buffers must not look used when the KV pool is sized
    return choice


_MEASURED: dict[tuple, MapBackendChoice] = {}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measuring_timer(
    map_dtype: torch.dtype, x_dtype: torch.dtype, d_in: int, d_out: int, group_size: int | None,
    device: torch.device | str, repeats: int,
) -> Timer:
    """The measurement :func:`fastest_map_backend` uses on CUDA and on a CPU (it runs on any device).

    Times a candidate on Gaussian rows and a Gaussian map after checking it against float64 arithmetic on
    the first :data:`CHECK_ROWS` rows (not the float32 reference: a process may let float32 matmuls run in
    TF32).

    Private generators: the measurement must not move the process's random state (sampling seeds).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(d_out, d_in, generator=gen) / d_in**0.5
    b = torch.randn(d_out, generator=gen)
    if group_size is not None:
        q, scale = (t.to(device) for t in quantize_int8_groupwise(a, group_size))
        b = b.to(device)
        a64 = dequantize_int8_groupwise(q, scale, group_size, dtype=torch.float64)

        def call(x: torch.Tensor, backend: str) -> torch.Tensor:
            return apply_map_int8(x, q, scale, b, group_size, backend=backend)
    else:
        a, b = a.to(device, map_dtype), b.to(device, map_dtype)
        a64 = a.double()

        def call(x: torch.Tensor, backend: str) -> torch.Tensor:
            return apply_map(x, a, b, backend=backend)

    def timer(backend: str, rows: int) -> float:
        x_gen = torch.Generator(device=device).manual_seed(rows)
        x = torch.randn(rows, d_in, generator=x_gen, device=device, dtype=torch.float32).to(x_dtype)
        got = call(x, backend)[:CHECK_ROWS].double()
        want = torch.addmm(b.double(), x[:CHECK_ROWS].double(), a64.t())
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))
        tol = TOLERANCE[x_dtype]
        if not err <= tol:
            raise ValueError(f"differs from float64 arithmetic by {err:.2e} of its largest entry (tolerance {tol:g})")
        return median_ms(lambda: call(x, backend), device=device, warmup=2, repeats=repeats)

    return timer
