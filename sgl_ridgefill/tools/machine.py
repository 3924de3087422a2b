"""The machine a benchmark ran on, as ``bench.json`` records it: CPU model, PyTorch's capability, native
bfloat16, the ISA caps in force, the server's dtype and thread count.

The CPU facts are this process's; when the server runs on this machine (``--serve``, or ``--server-pid``)
its environment is read for the thread count and ISA caps, which are what its matmuls ran under. A server
given only by ``--url`` may run elsewhere: then ``"server_on_this_machine"`` is false and the CPU facts
describe the benchmark client only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# Environment variables that cap the instructions PyTorch, oneDNN and MKL use (AVX2 emulation on a newer CPU).
ISA_CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def process_environment(pid: int) -> dict[str, str] | None:
    """The environment process ``pid`` started with (Linux ``/proc``), or ``None`` when unreadable."""
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def served_dtype(server_info: Mapping[str, Any], model_config: Mapping[str, Any] | None) -> str | None:
    """The dtype the server runs the model in: its ``dtype`` setting, or the checkpoint's when that is
    ``auto`` (as SGLang resolves it)."""
    value = server_info.get("dtype")
    if value in (None, "auto") and model_config is not None:
        value = model_config.get("torch_dtype") or model_config.get("dtype") or value
    return None if value is None else str(value).removeprefix("torch.")


def machine_record(*, dtype: str | None, server_env: Mapping[str, str] | None, server_local: bool) -> dict[str, Any]:
    """``bench.json``'s ``"machine"``: ``dtype`` is the served dtype; ``server_env`` the server's
    environment when known (its ``OMP_NUM_THREADS`` and ISA caps win over this process's)."""
    from ..cpu.dtype import CpuFeatures, cpu_model_name
    from ..cpu.environment import usable_cores

    env = dict(os.environ)
    if server_env is not None:
        env = {**{k: v for k, v in env.items() if k not in ISA_CAP_VARIABLES}, **server_env}
    features = CpuFeatures.detect(env)
    capability = features.capability
    cap = env.get("ATEN_CPU_CAPABILITY")
    if server_env is not None and cap and cap.upper() != capability.upper():
        capability = cap.upper()  # ATen honours a lower cap than this process runs at
        features = type(features)(capability, features.avx512_bf16, features.amx, features.onednn_max_isa)
    threads = env.get("OMP_NUM_THREADS")
    return {
        "cpu_model": cpu_model_name(),
        "capability": capability,
        "native_bf16": features.native_bf16,
        "bf16_hardware": features.hardware_bf16,
        "isa_caps": {k: env[k] for k in ISA_CAP_VARIABLES if env.get(k)},
        "dtype": dtype,
        "threads": int(threads) if threads and threads.isdigit() else usable_cores(),
        "usable_cores": usable_cores(),
        "server_on_this_machine": server_local,
    }


def folder_name(machine: Mapping[str, Any]) -> str:
    """``<capability>-<dtype>``, lower case: ``avx512-bfloat16``, ``avx2-float32``."""
    return f"{str(machine.get('capability') or 'unknown').lower()}-{machine.get('dtype') or 'unknown'}"
