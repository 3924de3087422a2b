"""How a selector describes itself to the registry and the policy compiler.

A selector is a plain function ``fn(inputs: SelectionInputs, **args) -> ranked rows [k] int64`` plus a
``SelectorSpec``: its typed parameters, how it resolves arguments against the deployment (split,
layers), which runtime statistics it needs, and its typical size (for ``policy explain``). The
function's docstring is the user-facing description; its first paragraph is the summary.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .base import Requirement, SelectionInputs

# Parameter kinds, as written in a policy: int (256), share (25%, stored as 0.25), str ("last"),
# bool (true), int_list ([3, 7, 11]).
PARAM_KINDS = ("int", "share", "str", "bool", "int_list")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


class ArgumentError(ValueError):
    """A selector argument does not fit the deployment; ``param`` names it (None: the call as a whole)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(frozen=True)
class Param:
    """One named selector parameter. ``minimum``/``maximum`` bound ints inclusively."""

    name: str
    kind: str
    doc: str
    default: Any = REQUIRED
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"Param {self.name!r}: kind must be one of {PARAM_KINDS}, got {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclasses.dataclass(frozen=True)
class BindContext:
    """Deployment facts known at compile time (None: not known, e.g. ``policy check`` without a model)."""

    arm: str
    split: int | None
    tail: int
    num_layers: int | None = None
    attention_layers: tuple[int, ...] | None = None


def _no_requirements(args: Mapping[str, Any]) -> tuple[Requirement, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class SelectorSpec:
    """A registered selector.

    fn: ``fn(inputs, **args) -> [k] int64`` ranked prefix rows, best first, unique.
    resolve: fills deployment-dependent defaults and checks arguments against the deployment
        (raises ``ArgumentError``); receives every parameter, defaults filled in.
    requirements: runtime statistics the resolved arguments need.
    ranks_all: the selector ranks every prefix row, so it is only meaningful under a budget.
    needs_tokens / needs_token_counts: it reads ``SelectionInputs.tokens`` / ``.token_counts``; either may
        depend on the resolved arguments (a function of them).
    expected_rows: rows it typically selects from a prefix of the given length (``policy explain``;
        an estimate, documented where it is an assumption).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    params: tuple[Param, ...] = ()
    resolve: Callable[[dict[str, Any], BindContext], dict[str, Any]] | None = None
    requirements: Callable[[Mapping[str, Any]], tuple[Requirement, ...]] = _no_requirements
    ranks_all: bool = False
    needs_tokens: bool | Callable[[Mapping[str, Any]], bool] = False
    needs_token_counts: bool | Callable[[Mapping[str, Any]], bool] = False
    expected_rows: Callable[[Mapping[str, Any], int], float] | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"selector name must be an identifier, got {self.name!r}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"selector {self.name!r} declares a parameter twice: {names}")
        if not inspect.getdoc(self.fn):
            raise ValueError(f"selector {self.name!r}: its function needs a docstring (users read it)")

    @property
    def summary(self) -> str:
        """First paragraph of the selector's docstring, on one line."""
        return " ".join((inspect.getdoc(self.fn) or "").strip().split("\n\n")[0].split())

    @property
    def description(self) -> str:
        return inspect.getdoc(self.fn) or ""

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def bind(self, args: Mapping[str, Any], context: BindContext) -> BoundSelector:
        """Fill defaults, resolve against ``context`` and return the callable selector.

        ``args`` hold already type-checked values keyed by parameter name.
        """
        unknown = sorted(set(args) - {p.name for p in self.params})
        if unknown:
            raise ArgumentError(f"{self.name}() has no parameter {unknown[0]!r}", unknown[0])
        full: dict[str, Any] = {}
        for p in self.params:
            if p.name in args:
                full[p.name] = args[p.name]
            elif p.required:
                raise ArgumentError(f"{self.name}() needs {p.name}: {p.doc}", None)
            else:
                full[p.name] = p.default
        if self.resolve is not None:
            full = self.resolve(full, context)
        return BoundSelector(self, tuple(sorted(full.items())))


@dataclasses.dataclass(frozen=True, repr=False)
class BoundSelector:
    """A selector with resolved arguments: call it on ``SelectionInputs``."""

    spec: SelectorSpec
    args: tuple[tuple[str, Any], ...]

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    @property
    def requirements(self) -> tuple[Requirement, ...]:
        return tuple(self.spec.requirements(self.kwargs))

    @property
    def needs_tokens(self) -> bool:
        need = self.spec.needs_tokens
        return bool(need(self.kwargs) if callable(need) else need)

    @property
    def needs_token_counts(self) -> bool:
        need = self.spec.needs_token_counts
        return bool(need(self.kwargs) if callable(need) else need)

    def expected_rows(self, prefix_len: int) -> float | None:
        if self.spec.expected_rows is None:
            return None
        return max(0.0, min(float(prefix_len), float(self.spec.expected_rows(self.kwargs, prefix_len))))

    def __call__(self, inputs: SelectionInputs) -> torch.Tensor:
        """Ranked prefix rows: [k] int64, best first, all below ``inputs.prefix_len``."""
        return self.spec.fn(inputs, **self.kwargs)

    def __repr__(self) -> str:
        return f"{self.spec.name}({', '.join(f'{k}={v!r}' for k, v in self.args)})"
