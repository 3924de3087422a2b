"""Every environment variable sgl-ridgefill reads, in one place, with one prefix.

The server settings (``--prefill-backend``, ``--ridgefill-*``) are carried to SGLang's scheduler processes
through variables named after them (``settings.py``): SGLang's ``ServerArgs`` is a sealed struct that keeps
only its own fields, and child processes inherit the environment. An offline ``sglang.Engine`` is enabled
the same way (``sgl_ridgefill.engine.ridgefill_engine`` sets them while the engine starts). A flag given on
the command line overwrites its variable, so it always wins over an exported one.
"""

from __future__ import annotations

import os

from .cpu.dtype import BF16_MATMUL  # "auto" | "native": bfloat16 matmuls on a CPU without bfloat16 (cpu/matmul.py)
from .settings import ENV_PREFIX, SETTINGS

PREFIX = ENV_PREFIX

SERVER: dict[str, str] = {s.name: s.env for s in SETTINGS}  # setting name -> variable
PREFILL_BACKEND = SERVER["prefill_backend"]  # "default" | "ridgefill"
ALLOW_VERSION_MISMATCH = PREFIX + "ALLOW_SGLANG_VERSION_MISMATCH"
CACHE_DIR = PREFIX + "CACHE_DIR"  # models, corpora
CENSUS = PREFIX + "CENSUS"  # a file: the host census of every RidgeFill request (gpu-check --tier host)

ALL = (*SERVER.values(), ALLOW_VERSION_MISMATCH, CACHE_DIR, CENSUS, BF16_MATMUL)


def get(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def flag(name: str) -> bool:
    return (get(name) or "").lower() in ("1", "true", "yes", "on")


def ridgefill_enabled() -> bool:
    return get(PREFILL_BACKEND, "default") == "ridgefill"
