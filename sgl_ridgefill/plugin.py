"""The ``sglang.srt.plugins`` entry point: a gate, then the hooks (``patches.py``).

Checks in order: the SGLang version is the pinned one (``compat.py``), then registers the always-on hooks
(flags, attention backend, request checks) and, when ``--prefill-backend ridgefill`` is on in this
process's environment, the runtime hooks, which are verified once SGLang has applied every plugin's hooks
(before the process goes on).
"""

from __future__ import annotations

import logging

from . import envs

logger = logging.getLogger("sgl_ridgefill")


def register() -> None:
    from .compat import SGLangVersionError, check_sglang_version

    enabled = envs.ridgefill_enabled()
    try:
        check_sglang_version()
    except SGLangVersionError as e:
        if enabled:
            raise SystemExit(str(e)) from None  # SGLang swallows exceptions; SystemExit stops the process
        logger.warning("%s (RidgeFill stays off)", e)
        return
    from .patches import register_hooks, verify_after_apply

    targets = register_hooks(enabled)
    if enabled:
        verify_after_apply(targets)
