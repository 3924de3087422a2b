"""Markdown cells and tables shared by ``REPORT.md`` (``report.py``) and ``docs/RESULTS.md`` (``results_md.py``)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, Callable

NA = "–"  # a number not measured or not run
Row = Mapping[str, Any]


def score(x: float | None) -> str:
    """A retrieval score (0-100)."""
    return NA if x is None else f"{x:.1f}"


def signed(fmt: str) -> Callable[[float | None], str]:
    """A formatter with an explicit sign, e.g. ``signed(".1f")(3) == "+3.0"``."""
    return lambda x: NA if x is None else f"{x:+{fmt}}"


def ci(row: Row, key: str, fmt: Callable[[float], str] = score) -> str:
    """``row[key] [low, high]``; only the estimate when the row has no interval."""
    if row.get(key) is None:
        return NA
    if row.get("low") is None or row.get("high") is None:
        return fmt(row[key])
    return f"{fmt(row[key])} [{fmt(row['low'])}, {fmt(row['high'])}]"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    if not rows:
        return "_Not measured in this run._"
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def image(path: pathlib.Path | None, alt: str) -> str:
    """A Markdown image of ``path`` relative to its own folder; empty when no plot was drawn."""
    return f"![{alt}]({path.name})" if path is not None else ""
