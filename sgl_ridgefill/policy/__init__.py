"""The ``.rfpolicy`` language: which rows a deployment computes exactly, and which corrections it applies.

Pipeline: ``parse_policy`` (text -> ``PolicyAst``, frozen dataclasses with source spans) ->
``compile_policy`` (checked against the maps folder and the model -> ``CompiledPolicy``) ->
``CompiledPolicy.select`` per request. Every user error is a ``PolicyError``.
"""

from __future__ import annotations

from .ast import PolicyAst
from .builtin import builtin_policy_names, builtin_policy_path, list_builtin_policies, resolve_policy_path
from .compiler import ARMS, CACHE_MODES, DEFAULT_TAIL, CompiledPolicy, compile_policy
from .corrections import TerminalState, ValueRescale
from .errors import PolicyError, Span
from .formatter import format_policy
from .parser import load_policy, parse_policy
from .targets import MapsInfo, ModelInfo

__all__ = [
    "ARMS",
    "CACHE_MODES",
    "DEFAULT_TAIL",
    "CompiledPolicy",
    "MapsInfo",
    "ModelInfo",
    "PolicyAst",
    "PolicyError",
    "Span",
    "TerminalState",
    "ValueRescale",
    "builtin_policy_names",
    "builtin_policy_path",
    "compile_policy",
    "format_policy",
    "list_builtin_policies",
    "load_policy",
    "parse_policy",
    "resolve_policy_path",
]
