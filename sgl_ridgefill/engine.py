"""Offline use: an ``sglang.Engine`` with RidgeFill on.

``sglang.Engine(**kwargs)`` refuses keyword arguments it does not know, and SGLang's ``ServerArgs`` keeps
only its own fields, so the RidgeFill settings (``settings.py``: ``ridgefill_maps``, ``ridgefill_split``,
...) travel as environment variables to the engine's scheduler process, exactly as the server flags do::

    from sgl_ridgefill.engine import ridgefill_engine
    llm = ridgefill_engine(model_path=M, ridgefill_maps="maps/qwen0.5b", ridgefill_split=12)
    llm.generate(prompt, {"max_new_tokens": 16, "custom_params": {"ridgefill": {"tail": 1024}}})

The variables are set only while the engine starts: ``sglang.Engine(...)`` spawns its scheduler and
detokenizer processes before it returns, and they keep the environment they were started with. The caller's
environment is then restored, so a later ``sglang.Engine`` in the same process is stock. The engine's
tokenizer manager runs in the caller's process; it gets the settings bound to it (``config.bind_config``).

(A script that starts an engine needs an ``if __name__ == "__main__":`` guard: SGLang spawns processes.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from . import envs
from .settings import keyword_settings


def ridgefill_environment(**options: Any) -> dict[str, str]:
    """The environment variables for ``options`` (the ``ridgefill_*`` keywords of :func:`ridgefill_engine`,
    one per server setting but ``prefill_backend``, which is always ``ridgefill``); ``None`` values are left out."""
    known = keyword_settings()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown RidgeFill option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    out = {envs.PREFILL_BACKEND: "ridgefill"}
    out.update({known[k].env: known[k].text(v) for k, v in options.items() if v is not None})
    return out


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` set in ``os.environ`` for the ``with`` block, the previous values restored after it."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ridgefill_engine(**kwargs: Any):
    """``sglang.Engine(**kwargs)`` with RidgeFill on; ``ridgefill_*`` keywords configure it.

    Validates the settings in this process first (clear errors before any process starts) and checks that
    the plugin is installed where SGLang looks for it. ``RIDGEFILL_*`` variables already exported apply where
    no keyword overrides them.
    """
    from importlib.metadata import entry_points

    from .config import ServerConfig, bind_config

    options = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("ridgefill_")}
    env = ridgefill_environment(**options)
    config = ServerConfig.from_env({**os.environ, **env})  # raises ValueError naming a bad option
    if not any(ep.value.startswith("sgl_ridgefill.") for ep in entry_points(group="sglang.srt.plugins")):
        raise RuntimeError("sgl-ridgefill is not installed as an SGLang plugin (pip install sgl-ridgefill)")
    import sglang

    with _environment(env):
        engine = sglang.Engine(**kwargs)
    if getattr(engine, "tokenizer_manager", None) is not None:
        bind_config(engine.tokenizer_manager, config)
    return engine
