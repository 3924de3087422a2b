"""Offline use: an ``sglang.Engine`` with RidgeFill on.

``sglang.Engine(**kwargs)`` refuses keyword arguments it does not know, and SGLang's ``ServerArgs`` keeps
only its own fields, so the RidgeFill settings travel as environment variables (``envs.py``) to the
engine's scheduler process, exactly as the server flags do::

    from sgl_ridgefill.engine import ridgefill_engine
    llm = ridgefill_engine(model_path=M, ridgefill_maps="maps/qwen0.5b", ridgefill_split=12)
    llm.generate(prompt, {"max_new_tokens": 16, "custom_params": {"ridgefill": {"tail": 1024}}})

(A script that starts an engine needs an ``if __name__ == "__main__":`` guard: SGLang spawns processes.)
"""

from __future__ import annotations

import os
from typing import Any

from . import envs

_OPTIONS = {
    "ridgefill_maps": envs.MAPS,
    "ridgefill_policy": envs.POLICY,
    "ridgefill_split": envs.SPLIT,
    "ridgefill_tail": envs.TAIL,
    "ridgefill_arm": envs.ARM,
    "ridgefill_cache_mode": envs.CACHE_MODE,
    "ridgefill_map_dtype": envs.MAP_DTYPE,
}


def ridgefill_environment(**options: Any) -> dict[str, str]:
    """The environment variables for ``options`` (the ``ridgefill_*`` keywords of :func:`ridgefill_engine`)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"unknown RidgeFill option(s) {', '.join(unknown)}; known: {', '.join(sorted(_OPTIONS))}")
    out = {envs.PREFILL_BACKEND: "ridgefill"}
    out.update({_OPTIONS[k]: str(v) for k, v in options.items() if v is not None})
    return out


def ridgefill_engine(**kwargs: Any):
    """``sglang.Engine(**kwargs)`` with RidgeFill on; ``ridgefill_*`` keywords configure it.

    Validates the settings in this process first (clear errors before any process starts) and checks that
    the plugin is installed where SGLang looks for it.
    """
    from importlib.metadata import entry_points

    from .config import ServerConfig

    options = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("ridgefill_")}
    env = ridgefill_environment(**options)
    if not any(ep.value.startswith("sgl_ridgefill.") for ep in entry_points(group="sglang.srt.plugins")):
        raise RuntimeError("sgl-ridgefill is not installed as an SGLang plugin (pip install sgl-ridgefill)")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        ServerConfig.from_env()  # raises ValueError naming a bad option
        import sglang

        return sglang.Engine(**kwargs)
    except BaseException:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        raise
