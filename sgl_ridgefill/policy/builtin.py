"""The policies shipped in ``policies/`` (package ``sgl_ridgefill.policies``), one per deployment."""

from __future__ import annotations

import importlib.resources
import os
import pathlib

from .errors import PolicyError, did_you_mean

SUFFIX = ".rfpolicy"
_PACKAGE = "sgl_ridgefill.policies"


def _folder() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files(_PACKAGE)))


def builtin_policy_names() -> tuple[str, ...]:
    """Names of the shipped policies (file names without ``.rfpolicy``), sorted."""
    return tuple(sorted(p.name[: -len(SUFFIX)] for p in _folder().glob(f"*{SUFFIX}")))


def builtin_policy_path(name: str) -> pathlib.Path:
    """Path of a shipped policy, e.g. ``builtin_policy_path("qwen2.5-0.5b-default")``."""
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    path = _folder() / f"{stem}{SUFFIX}"
    if "/" in stem or "\\" in stem or not path.is_file():
        raise PolicyError(f"no shipped policy named {name!r}{_hint(name)}")
    return path


def resolve_policy_path(name_or_path: str | os.PathLike) -> pathlib.Path:
    """An existing policy file, else the shipped policy of that name (``PolicyError`` if neither)."""
    path = pathlib.Path(name_or_path)
    if path.is_file():
        return path
    text = os.fspath(name_or_path)
    if os.path.dirname(text):
        raise PolicyError("no such policy file", filename=text)
    stem = text[: -len(SUFFIX)] if text.endswith(SUFFIX) else text
    shipped = _folder() / f"{stem}{SUFFIX}"
    if not shipped.is_file():
        raise PolicyError(f"no policy file or shipped policy named {text!r}{_hint(text)}")
    return shipped


def _hint(name: str) -> str:
    names = builtin_policy_names()
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    return did_you_mean(stem, names) or f"; shipped policies: {', '.join(names)}"


# The runtime's name for builtin_policy_names.
list_builtin_policies = builtin_policy_names
