"""Every environment variable sgl-ridgefill reads, in one place, with one prefix.

The server flags (``--prefill-backend``, ``--ridgefill-*``) are carried to SGLang's scheduler processes
through these variables: SGLang's ``ServerArgs`` is a sealed struct that keeps only its own fields, and
child processes inherit the environment. An offline ``sglang.Engine`` is enabled the same way
(``sgl_ridgefill.engine.ridgefill_engine`` sets them for you).
"""

from __future__ import annotations

import os

PREFIX = "RIDGEFILL_"

PREFILL_BACKEND = "RIDGEFILL_PREFILL_BACKEND"  # "default" | "ridgefill"
MAPS = "RIDGEFILL_MAPS"  # maps folder
POLICY = "RIDGEFILL_POLICY"  # .rfpolicy file or shipped policy name
SPLIT = "RIDGEFILL_SPLIT"
TAIL = "RIDGEFILL_TAIL"
ARM = "RIDGEFILL_ARM"
CACHE_MODE = "RIDGEFILL_CACHE_MODE"  # "no_insert" | "namespace"
MAP_DTYPE = "RIDGEFILL_MAP_DTYPE"  # "auto" | "bfloat16" | "float32" | "int8"
ALLOW_VERSION_MISMATCH = "RIDGEFILL_ALLOW_SGLANG_VERSION_MISMATCH"
CACHE_DIR = "RIDGEFILL_CACHE_DIR"  # models, corpora

ALL = (PREFILL_BACKEND, MAPS, POLICY, SPLIT, TAIL, ARM, CACHE_MODE, MAP_DTYPE, ALLOW_VERSION_MISMATCH, CACHE_DIR)


def get(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def flag(name: str) -> bool:
    return (get(name) or "").lower() in ("1", "true", "yes", "on")


def ridgefill_enabled() -> bool:
    return get(PREFILL_BACKEND, "default") == "ridgefill"
