"""Checking a call's literal arguments against typed parameters (selectors and corrections alike)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_ridgefill.selectors.spec import Param

from . import ast
from .errors import PolicyError, Span, did_you_mean
from .formatter import format_literal

Fail = Callable[[str, "Span | None"], PolicyError]

_KIND_WORDS = {
    "int": "an integer",
    "share": "a percentage such as 25%",
    "str": "a string",
    "bool": "true or false",
    "int_list": "a list of integers such as [3, 7]",
}


def _literal_word(lit: ast.Literal) -> str:
    kind = {
        ast.IntLit: "the integer",
        ast.FloatLit: "the number",
        ast.PercentLit: "the percentage",
        ast.StrLit: "the string",
        ast.BoolLit: "",
        ast.ListLit: "the list",
    }[type(lit)]
    return f"{kind} {format_literal(lit)}".strip()


def _int(value: int, param: Param, where: str, span, fail: Fail) -> int:
    lo, hi = param.minimum, param.maximum
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        if hi is None:
            bound = f"at least {lo}"
        elif lo is None:
            bound = f"at most {hi}"
        else:
            bound = f"between {lo} and {hi}"
        raise fail(f"argument {param.name} of {where} must be {bound}, got {value}", span)
    return value


def convert_value(lit: ast.Literal, param: Param, where: str, fail: Fail) -> Any:
    """The Python value of ``lit`` for ``param`` (a share becomes a fraction), or a ``PolicyError``."""

    def wrong() -> PolicyError:
        return fail(f"argument {param.name} of {where} must be {_KIND_WORDS[param.kind]}, got {_literal_word(lit)}", lit.span)

    if param.kind == "int":
        if not isinstance(lit, ast.IntLit):
            raise wrong()
        return _int(lit.value, param, where, lit.span, fail)
    if param.kind == "share":
        if not isinstance(lit, ast.PercentLit):
            raise wrong()
        if not 0.0 <= lit.value <= 100.0:
            raise fail(f"argument {param.name} of {where} must be between 0% and 100%, got {format_literal(lit)}", lit.span)
        return lit.fraction
    if param.kind == "bool":
        if not isinstance(lit, ast.BoolLit):
            raise wrong()
        return lit.value
    if param.kind == "str":
        if not isinstance(lit, ast.StrLit):
            raise wrong()
        if param.choices and lit.value not in param.choices:
            hint = did_you_mean(lit.value, param.choices)
            options = ", ".join(f'"{c}"' for c in param.choices)
            raise fail(
                f"argument {param.name} of {where} must be one of {options}, got {format_literal(lit)}{hint}", lit.span
            )
        return lit.value
    if param.kind == "int_list":
        if not isinstance(lit, ast.ListLit) or not all(isinstance(i, ast.IntLit) for i in lit.items):
            raise wrong()
        return tuple(_int(i.value, param, where, i.span, fail) for i in lit.items)
    raise AssertionError(f"unhandled parameter kind {param.kind}")


def convert_args(call: ast.Call, params: tuple[Param, ...], fail: Fail) -> dict[str, Any]:
    """Named literal arguments of ``call`` checked against ``params``: {name: value}.

    Refuses positional arguments, unknown names (with "did you mean") and repeated names.
    """
    where = f"{call.name}()"
    by_name = {p.name: p for p in params}
    values: dict[str, Any] = {}
    for arg in call.args:
        if arg.name is None:
            example = f"{params[0].name}={format_literal(arg.value)}" if params else "name=value"
            raise fail(f"arguments of {where} are named, e.g. {call.name}({example})", arg.span)
        if arg.name not in by_name:
            known = ", ".join(by_name) or "none"
            hint = did_you_mean(arg.name, by_name)
            message = f"{where} has no argument {arg.name!r}" + (hint or f"; its arguments: {known}")
            raise fail(message, arg.name_span)
        if arg.name in values:
            raise fail(f"argument {arg.name} of {where} is given twice", arg.name_span)
        values[arg.name] = convert_value(arg.value, by_name[arg.name], where, fail)
    return values
