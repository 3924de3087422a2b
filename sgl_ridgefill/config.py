"""Server-wide RidgeFill settings, read once per process from the environment the CLI flags write.

One field per entry of ``settings.SETTINGS`` (same names, order and defaults: the class is made from the
table); the table also validates each value and reads it from the environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .settings import ALL_POLICIES, ARMS, CACHE_MODES, DEFAULT_TAIL, MAP_DTYPES, SETTINGS, SETTINGS_BY_NAME

__all__ = ["ARMS", "CACHE_MODES", "DEFAULT_TAIL", "MAP_DTYPES", "ServerConfig", "bind_config", "config_for"]


class _ServerConfigBase:
    def __post_init__(self) -> None:
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if value is not None:
                setting.check(value)
        if self.enabled and self.maps is None and (self.arm or "ridgefill") == "ridgefill":
            raise ValueError(
                f"{_flag('prefill_backend')} ridgefill needs {_flag('maps')} DIR (fit one with `sgl-ridgefill "
                "calibrate`); only the identity, nofill and exact arms run without maps"
            )

    @property
    def enabled(self) -> bool:
        return self.prefill_backend == "ridgefill"

    def allows_policy(self, name: str, own: str | None) -> bool:
        """Whether a request may select the policy ``name``; ``own`` is the name of the server's compiled
        policy (``--ridgefill-policy`` may be a file, so only the runtime knows it). Whether ``name`` exists
        is the runtime's question, asked after this one, so a refused client learns nothing of the others."""
        return (
            name == own
            or self.diagnostics
            or ALL_POLICIES in self.request_policies
            or name in self.request_policies
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerConfig:
        """The settings ``environ`` (default: this process's environment) holds; ``ValueError`` names the
        variable or flag of a bad one."""
        environ = os.environ if environ is None else environ
        return cls(**{s.name: s.read(environ) for s in SETTINGS})


# One field per entry of settings.SETTINGS, same names, order and defaults: a setting is declared once, there.
ServerConfig = dataclasses.make_dataclass(
    "ServerConfig", [s.config_field() for s in SETTINGS], bases=(_ServerConfigBase,), frozen=True,
)
ServerConfig.__module__ = __name__  # pickles by name, as a class written here would
ServerConfig.__doc__ = """What ``--prefill-backend`` and the ``--ridgefill-*`` flags asked for: one field per entry of
``settings.SETTINGS`` (which says what each means).

``split``/``tail``/``arm``/``cache_mode`` given here override the policy file's; ``None`` means "use the
policy's, else the maps folder's default split and ``DEFAULT_TAIL``"."""


def _flag(name: str) -> str:
    return SETTINGS_BY_NAME[name].flag


_BOUND = "_ridgefill_config"


def bind_config(manager: Any, config: ServerConfig) -> None:
    """Give ``manager`` (an SGLang ``TokenizerManager``) the settings it checks requests against.

    ``ridgefill_engine`` sets the ``RIDGEFILL_*`` variables only while its engine starts, so the engine's
    tokenizer manager, which runs in the caller's process, cannot read them from the environment later."""
    setattr(manager, _BOUND, config)


def config_for(manager: Any) -> ServerConfig:
    """The settings ``manager`` checks requests against: those bound to it, else this process's environment
    (read at its first request and kept)."""
    config = getattr(manager, _BOUND, None)
    if config is None:
        config = ServerConfig.from_env()
        bind_config(manager, config)
    return config
