"""The server flags RidgeFill adds to ``python -m sglang.launch_server``.

SGLang's ``ServerArgs`` is a sealed struct: it keeps only its own fields. Each flag is therefore a store
action that also exports its value to an environment variable (``envs.py``), which the scheduler
processes inherit. The actions derive from argparse's store action because SGLang's ``--config`` YAML
merger accepts only store and store_true options.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from . import envs
from .config import ARMS, CACHE_MODES, MAP_DTYPES


class _ExportAction(argparse._StoreAction):  # noqa: SLF001 (see module docstring)
    env_name: str = ""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        os.environ[self.env_name] = str(values)


def _action(env_name: str) -> type[_ExportAction]:
    return type(f"_Export_{env_name}", (_ExportAction,), {"env_name": env_name})


# (flag, env var, argparse keyword arguments)
FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--prefill-backend", envs.PREFILL_BACKEND, dict(
        choices=["default", "ridgefill"], default=None,
        help="Prefill implementation: 'ridgefill' fills upper-layer KV of the prefix from ridge maps "
             "(sgl-ridgefill). Default: SGLang's own prefill.")),
    ("--ridgefill-maps", envs.MAPS, dict(
        default=None, metavar="DIR", help="Maps folder written by `sgl-ridgefill calibrate`.")),
    ("--ridgefill-policy", envs.POLICY, dict(
        default=None, metavar="FILE_OR_NAME",
        help="A .rfpolicy file, or the name of a policy shipped with sgl-ridgefill (`sgl-ridgefill policy list`).")),
    ("--ridgefill-split", envs.SPLIT, dict(
        type=int, default=None, metavar="S", help="Split layer S (overrides the policy; default: the maps' split).")),
    ("--ridgefill-tail", envs.TAIL, dict(
        type=int, default=None, metavar="T", help="Tail length T in tokens (overrides the policy; default 1024).")),
    ("--ridgefill-arm", envs.ARM, dict(
        choices=list(ARMS), default=None, help="Server-wide arm (overrides the policy; default ridgefill).")),
    ("--ridgefill-cache-mode", envs.CACHE_MODE, dict(
        choices=list(CACHE_MODES), default=None,
        help="no_insert (default): filled KV never enters the radix cache; namespace: RidgeFill requests "
             "share filled KV among themselves, keyed by maps, split, tail and policy.")),
    ("--ridgefill-map-dtype", envs.MAP_DTYPE, dict(
        choices=list(MAP_DTYPES), default=None, help="Dtype the maps are kept in (default: the model's).")),
]


def add_ridgefill_arguments(parser: argparse.ArgumentParser) -> bool:
    """Add the flags to ``parser`` unless it has them; returns whether they were added."""
    existing = {opt for action in parser._actions for opt in action.option_strings}  # noqa: SLF001
    if "--prefill-backend" in existing:
        return False
    group = parser.add_argument_group("RidgeFill (sgl-ridgefill)")
    for flag, env_name, kwargs in FLAGS:
        group.add_argument(flag, action=_action(env_name), **kwargs)
    return True
