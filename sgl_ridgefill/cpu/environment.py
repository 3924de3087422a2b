"""The environment and server flags that run SGLang 0.5.23's PyPI wheel on a CPU-only machine.

The recipe (SGLANG_NOTES.md, "CPU"): a stand-in ``sgl_kernel`` first on ``PYTHONPATH``,
``SGLANG_USE_CPU_ENGINE=1`` (drives ``is_cpu()``), ``--device cpu``, a pure-PyTorch attention backend, no
CUDA graphs. Everything here is scoped to CPU use: nothing is applied unless a caller asks for it.
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
}


def cpu_environment(base: Mapping[str, str] | None = None, *, threads: int | None = None) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``) set up for SGLang on CPU.

    ``threads`` pins the intra-op thread count of the scheduler process (default: every core).
    """
    env = dict(os.environ if base is None else base)
    paths = [str(SHIM_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SHIM_DIR)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    n = threads or os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(n))
    return env


def apply_cpu_environment(*, threads: int | None = None) -> None:
    """Set up *this* process for SGLang on CPU (must run before ``sglang`` or ``sgl_kernel`` is imported)."""
    import sys

    if "sgl_kernel" in sys.modules and not getattr(sys.modules["sgl_kernel"], "RIDGEFILL_CPU_SHIM", False):
        raise RuntimeError("sgl_kernel was imported before the CPU environment was applied")
    env = cpu_environment(threads=threads)
    os.environ.update({k: env[k] for k in ("PYTHONPATH", "SGLANG_USE_CPU_ENGINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS")})
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
