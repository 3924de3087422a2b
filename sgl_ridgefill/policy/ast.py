"""The parsed form of a ``.rfpolicy`` file: frozen dataclasses that carry their source span.

Spans and the source text never take part in equality, so two policies that differ only in layout,
parentheses that change nothing, or number spelling (``5%`` vs ``5.0%``) compare equal; comments do.
Nothing here is validated beyond the grammar: ``compile_policy`` checks meaning.
"""

from __future__ import annotations

import dataclasses
from typing import Union

from .errors import Span


def _span():
    return dataclasses.field(default=None, compare=False, repr=False)


def _comments():
    return dataclasses.field(default=(), kw_only=True)


# ---- literals ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class IntLit:
    value: int
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class FloatLit:
    value: float
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class PercentLit:
    """``value`` as written: ``5%`` is ``PercentLit(5.0)``."""

    value: float
    span: Span | None = _span()

    @property
    def fraction(self) -> float:
        return self.value / 100.0


@dataclasses.dataclass(frozen=True)
class StrLit:
    value: str
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class BoolLit:
    value: bool
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class ListLit:
    items: tuple[Literal, ...]
    span: Span | None = _span()


Literal = Union[IntLit, FloatLit, PercentLit, StrLit, BoolLit, ListLit]
Number = Union[IntLit, FloatLit, PercentLit]

# ---- row expressions --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arg:
    """``name=value``, or a bare ``value`` (``name`` None; the compiler asks for a name)."""

    name: str | None
    value: Literal
    span: Span | None = _span()
    name_span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Call:
    """``name(args)``: a selector in a row expression, a correction after ``correct``."""

    name: str
    args: tuple[Arg, ...]
    span: Span | None = _span()
    name_span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class SetOp:
    """``left | right`` (union), ``left & right`` (intersection) or ``left - right`` (difference)."""

    op: str
    left: Expr
    right: Expr
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class Top:
    """``top(operand, limit)``: the best rows of ``operand``; a percentage is a share of the operand."""

    operand: Expr
    limit: Budget
    span: Span | None = _span()


Expr = Union[Call, SetOp, Top]


@dataclasses.dataclass(frozen=True)
class FixedBudget:
    """``10%`` (of the prefix, or of the operand inside ``top``) or ``256`` rows."""

    value: Number
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class SizeBudget:
    """``[factor *] size(operand)``: a count equal to factor times the rows ``operand`` selects."""

    factor: Number | None
    operand: Expr
    span: Span | None = _span()


Budget = Union[FixedBudget, SizeBudget]


@dataclasses.dataclass(frozen=True)
class Reserve:
    """``reserve rows up to limit``: rows of ``rows`` taken first inside the budget, at most ``limit``."""

    rows: Expr
    limit: Budget
    span: Span | None = _span()


# ---- statements -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Comment:
    """``# text``; ``text`` is everything after ``#`` with trailing whitespace removed."""

    text: str
    span: Span | None = _span()


@dataclasses.dataclass(frozen=True)
class ArmStmt:
    value: str
    span: Span | None = _span()
    value_span: Span | None = _span()
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class SplitStmt:
    """``split S``, or ``split S from N tokens``: prompts of at least ``N`` tokens run at split ``S``."""

    value: Number
    span: Span | None = _span()
    from_tokens: Number | None = dataclasses.field(default=None, kw_only=True)
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class TailStmt:
    value: Number
    span: Span | None = _span()
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class CacheStmt:
    value: str
    span: Span | None = _span()
    value_span: Span | None = _span()
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class CorrectStmt:
    call: Call
    span: Span | None = _span()
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True)
class SelectStmt:
    """``select rows [budget B] [reserve R up to B]... [plus P]``; clauses are kept per kind in order
    (the compiler refuses a second ``budget`` or ``plus``)."""

    rows: Expr
    budgets: tuple[Budget, ...] = ()
    reserves: tuple[Reserve, ...] = ()
    plus: tuple[Expr, ...] = ()
    span: Span | None = _span()
    leading: tuple[Comment, ...] = _comments()
    trailing: Comment | None = dataclasses.field(default=None, kw_only=True)


Statement = Union[ArmStmt, SplitStmt, TailStmt, CacheStmt, CorrectStmt, SelectStmt]

STATEMENT_KEYWORDS = {
    ArmStmt: "arm",
    SplitStmt: "split",
    TailStmt: "tail",
    CacheStmt: "cache",
    CorrectStmt: "correct",
    SelectStmt: "select",
}


@dataclasses.dataclass(frozen=True)
class PolicyAst:
    """One ``policy "name" { ... }`` file.

    leading: comments before ``policy``; footer: comments after the last statement, inside the braces;
    trailing: comments after the closing brace. Statement comments sit on the statements.
    """

    name: str
    statements: tuple[Statement, ...]
    leading: tuple[Comment, ...] = ()
    footer: tuple[Comment, ...] = ()
    trailing: tuple[Comment, ...] = ()
    span: Span | None = _span()
    name_span: Span | None = _span()
    source: str = dataclasses.field(default="", compare=False, repr=False)

    @property
    def filename(self) -> str:
        return self.span.filename if self.span is not None else "<policy>"
