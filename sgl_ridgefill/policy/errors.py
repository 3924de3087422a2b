"""The one error family of the policy language, with source locations a user can act on.

``str(PolicyError)`` is the whole message::

    llama.rfpolicy:5:10: error: unknown selector 'atention_topk'; did you mean 'attention_topk'?
       5 |   select atention_topk(q=64)
         |          ^^^^^^^^^^^^^
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Span:
    """Where a construct sits in its source: 1-based line and column, 0-based character offsets."""

    filename: str
    line: int
    column: int
    end_line: int
    end_column: int
    start: int
    end: int


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest known name, or ``""`` when none is close."""
    match = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def _display(text: str) -> str:
    return text.expandtabs(4).replace("\r", "")


def render_caret(source: str, span: Span) -> str:
    """The offending line with a gutter and a caret line under ``span`` (first line of it only)."""
    lines = source.split("\n")
    if not 1 <= span.line <= len(lines):
        return ""
    line = lines[span.line - 1]
    start_col = max(1, min(span.column, len(line) + 1))
    if span.end_line == span.line:
        end_col = max(start_col + 1, min(span.end_column, len(line) + 1))
    else:
        end_col = max(start_col + 1, len(line) + 1)
    lead = len(_display(line[: start_col - 1]))
    width = max(1, len(_display(line[: end_col - 1])) - lead)
    number = str(span.line)
    gutter = " " * len(number)
    return f"{number:>4} | {_display(line)}\n{gutter:>4} | {' ' * lead}{'^' * width}"


class PolicyError(ValueError):
    """A policy that cannot be parsed, compiled or found. ``str(e)`` is the full user message.

    message: the one-line description; filename, line, column: where (None when not tied to a place).
    """

    def __init__(self, message: str, *, span: Span | None = None, source: str | None = None, filename: str | None = None) -> None:
        self.message = message
        self.span = span
        self.filename = span.filename if span is not None else filename
        self.line = span.line if span is not None else None
        self.column = span.column if span is not None else None
        super().__init__(self._render(source))

    def _render(self, source: str | None) -> str:
        if self.span is None:
            return f"{self.filename}: error: {self.message}" if self.filename else f"error: {self.message}"
        head = f"{self.filename}:{self.line}:{self.column}: error: {self.message}"
        caret = render_caret(source, self.span) if source is not None else ""
        return f"{head}\n{caret}" if caret else head
