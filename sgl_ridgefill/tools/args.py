"""The argument types of the offline commands, and the parser and command line each ``python -m`` one starts
from.

An argument type turns the text of one flag into its value or raises ``argparse.ArgumentTypeError``, which
argparse prints as ``argument --flag: <message>`` and exits with 2: a bad flag never reaches the work.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any


def csv(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def ints(*, minimum: int = 1, what: str = "integers", example: str = "2048,4096") -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of at least one integer, each ``>= minimum`` (``what`` names them in the error)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(part) for part in csv(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} like {example}, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum} like {example}, got {text!r}")
        return values

    return parse


def integer(*, minimum: int = 0, auto: bool = False) -> Callable[[str], int | None]:
    """One integer ``>= minimum``; with ``auto``, the word ``auto`` too (as ``None``)."""
    expected = f"{'auto or ' if auto else ''}an integer >= {minimum}"

    def parse(text: str) -> int | None:
        if auto and text == "auto":
            return None
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


def positive_number_or_auto(text: str) -> float | None:
    """A number ``> 0``, or ``auto`` (``None``)."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def choices(known: Sequence[str], *, what: str, every: str | None = None) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of at least one of ``known`` (``what`` names them); ``every`` (e.g. ``"all"``) is
    the word for all of them."""
    also = f", or {every}" if every else ""

    def parse(text: str) -> tuple[str, ...]:
        if every is not None and text.strip() == every:
            return tuple(known)
        values = csv(text)
        for value in values:
            if value not in known:
                raise argparse.ArgumentTypeError(f"unknown {what} {value!r}; known: {', '.join(known)}{also}")
        if not values:
            raise argparse.ArgumentTypeError(f"expected {what}s like {','.join(known[:2])} (known: {', '.join(known)}){also}")
        return values

    return parse


def map_kinds(text: str) -> tuple[str, ...]:
    """Map kinds (``residual,kv+context``), or ``all``."""
    from ..maps.kinds import MAP_KINDS

    return choices(tuple(MAP_KINDS), what="map kind", every="all")(text)


def map_kind(text: str) -> str:
    """One map kind."""
    from ..maps.kinds import MAP_KINDS

    if text not in MAP_KINDS:
        raise argparse.ArgumentTypeError(f"unknown map kind {text!r}; known: {', '.join(MAP_KINDS)}")
    return text


layers = ints(minimum=0, what="layer numbers", example="12,16")
token_counts = ints(minimum=1, what="token counts", example="2048,4096")


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (``'{"tail": 2048}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object like '{{\"tail\": 2048}}', got {text!r}")
    return value


def command_parser(module: str, doc: str | None, *, whole_doc: bool = False) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the first line of the module's docstring (``whole_doc``:
    all of it, as written)."""
    if whole_doc:
        return argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.strip().splitlines()[0] if doc else None)


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    """The command a result was made with, to print beside it (``argv`` as given, else this process's)."""
    return shlex.join([*shlex.split(prog), *(sys.argv[1:] if argv is None else argv)])
