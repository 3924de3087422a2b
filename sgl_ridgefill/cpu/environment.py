"""The environment and server flags that run SGLang 0.5.23's PyPI wheel on a CPU-only machine.

The recipe: a stand-in ``sgl_kernel`` first on ``PYTHONPATH``,
``SGLANG_USE_CPU_ENGINE=1`` (drives ``is_cpu()``), ``--device cpu``, a pure-PyTorch attention backend, no
CUDA graphs. Everything here is scoped to CPU use: nothing is applied unless a caller asks for it.

Four settings are about speed, not about running at all:

- ``--sleep-on-idle``: without it the scheduler's event loop polls its sockets in a busy loop and keeps
  one core at 100 % whenever it has nothing to do (measured: 9.5 CPU-seconds per 10 s idle). On a small
  machine that is a whole core taken from the client, from other servers and from tests. With it the loop
  blocks in ``zmq.Poller.poll``, which returns as soon as a request arrives, so TTFT does not change.
- the intra-op thread count (``OMP_NUM_THREADS``) follows the cores this process may run on (its CPU
  affinity), not the machine's core count. SGLang leaves the thread count alone on CPU unless its AMX
  kernels are present (they are not with the stand-in), so this is what the scheduler process uses.
- ``OMP_WAIT_POLICY=PASSIVE``: a thread that reaches the end of a parallel region sleeps instead of
  spinning. With the default (spin first), whenever another process holds one of the cores, every
  elementwise op (norms, activations, RoPE: a third of a prefill) ends with one thread spinning on the
  only free core while its partner waits to be scheduled: measured on 2 shared cores, an RMSNorm over
  1,024 rows took 26-43 ms with 2 spinning threads, 2-4 ms with 2 passive threads and 3-6 ms with 1
  thread; GEMMs and flash attention did not change. The cost is a futex wake-up (microseconds) per
  parallel region.
- glibc's malloc keeps freed memory (:data:`MALLOC_ENV`): by default every tensor above its mmap threshold
  (at most 32 MiB) gets fresh pages from the kernel and returns them when freed, so a prefill pays a page
  fault per 4 KiB of every large activation, again in every layer. Measured on 4,096 rows: the chunked
  delta rule of one GDN layer 221 -> 136 ms, a ``[4096, 1024] x [1024, 3072]`` bf16 projection 32 -> 12 ms.
  The process keeps its peak heap instead of returning it between requests (a server reaches that peak
  on its longest prompt anyway).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

SHIM_DIR = pathlib.Path(__file__).resolve().parent / "shim"

# Flags for `python -m sglang.launch_server` / keyword arguments for `sglang.Engine`.
CPU_SERVER_ARGS: dict[str, object] = {
    "device": "cpu",
    "attention_backend": "ridgefill_cpu",
    "cuda_graph_backend_decode": "disabled",
    "cuda_graph_backend_prefill": "disabled",
    "sampling_backend": "pytorch",
    "sleep_on_idle": True,
    # SGLang's scheduler watchdog stops the server when one forward runs past it (300 s by default, sized for a
    # GPU); one 32K prefill on two cores runs longer.
    "watchdog_timeout": 3600,
}


# glibc: serve every allocation from the heap and never give its top back (read when a process starts).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 36)}


# What a Gated DeltaNet hybrid (Qwen3.5, Qwen3-Next) needs besides: SGLang's mamba radix cache snapshots
# states mid-prompt only on GPU-like platforms (``extra_buffer``); ``no_buffer`` caches sequence-end states,
# needs page size 1 and the overlap scheduler off.
HYBRID_CPU_SERVER_ARGS: dict[str, object] = {
    "mamba_radix_cache_strategy": "no_buffer",
    "disable_overlap_schedule": True,
}


def is_hybrid_model(model_path: str | os.PathLike[str] | None) -> bool:
    """Whether the model folder at ``model_path`` is a Gated DeltaNet hybrid (from its ``config.json``)."""
    import json

    if model_path is None:
        return False
    path = pathlib.Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    text = config.get("text_config") or {}
    model_type = config.get("model_type") or text.get("model_type")
    layer_types = config.get("layer_types") or text.get("layer_types") or ()
    from ..arch import HYBRID_MODEL_TYPES

    return model_type in HYBRID_MODEL_TYPES or "linear_attention" in layer_types


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), which can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_environment(base: Mapping[str, str] | None = None, *, threads: int | None = None) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``) set up for SGLang on CPU.

    ``threads`` pins the intra-op thread count of the scheduler process (default: every usable core; an
    ``OMP_NUM_THREADS`` already in ``base`` is kept).
    """
    env = dict(os.environ if base is None else base)
    paths = [str(SHIM_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SHIM_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for key, value in MALLOC_ENV.items():
        env.setdefault(key, value)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", str(usable_cores()))
    return env


def apply_cpu_environment(*, threads: int | None = None) -> None:
    """Set up *this* process for SGLang on CPU (must run before ``sglang`` or ``sgl_kernel`` is imported)."""
    import sys

    if "sgl_kernel" in sys.modules and not getattr(sys.modules["sgl_kernel"], "RIDGEFILL_CPU_SHIM", False):
        raise RuntimeError("sgl_kernel was imported before the CPU environment was applied")
    env = cpu_environment(threads=threads)
    keys = ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS",
            "OMP_WAIT_POLICY", *MALLOC_ENV)
    os.environ.update({k: env[k] for k in keys})
    if str(SHIM_DIR) not in sys.path:
        sys.path.insert(0, str(SHIM_DIR))


def server_cli_args(overrides: Mapping[str, object] | None = None) -> list[str]:
    """``CPU_SERVER_ARGS`` (plus ``overrides``) as ``launch_server`` command-line flags."""
    merged = {**CPU_SERVER_ARGS, **(overrides or {})}
    out: list[str] = []
    for key, value in merged.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def cpu_shim_active() -> bool:
    """Whether this process runs SGLang through the CPU recipe (the ``sgl_kernel`` stand-in is the one found)."""
    import importlib.util

    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return False
    spec = importlib.util.find_spec("sgl_kernel")
    origin = getattr(spec, "origin", None) if spec is not None else None
    return origin is not None and pathlib.Path(origin).resolve().is_relative_to(SHIM_DIR)
