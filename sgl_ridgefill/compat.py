"""The SGLang version sgl-ridgefill was built against, read back from the one pin in pyproject.toml."""

from __future__ import annotations

import logging
import re
from importlib import metadata

from . import envs

logger = logging.getLogger("sgl_ridgefill")
DIST = "sgl-ridgefill"


class SGLangVersionError(RuntimeError):
    pass


def pinned_sglang_version() -> str | None:
    try:
        requires = metadata.requires(DIST) or []
    except metadata.PackageNotFoundError:
        return None
    for req in requires:
        m = re.match(r"^sglang\s*==\s*([^\s;,]+)", req)
        if m:
            return m.group(1)
    return None


def check_sglang_version() -> str:
    """Raise unless the installed SGLang is the pinned one (``RIDGEFILL_ALLOW_SGLANG_VERSION_MISMATCH=1``
    downgrades the error to a warning). Returns the installed version."""
    import sglang

    installed = getattr(sglang, "__version__", "unknown")
    pinned = pinned_sglang_version()
    if pinned is None or installed == pinned:
        return installed
    msg = (
        f"sgl-ridgefill is built for SGLang {pinned}, but SGLang {installed} is installed; its hook points "
        f"may have moved. Install sglang=={pinned}, or set {envs.ALLOW_VERSION_MISMATCH}=1 to try anyway."
    )
    if envs.flag(envs.ALLOW_VERSION_MISMATCH):
        logger.warning(msg)
        return installed
    raise SGLangVersionError(msg)
