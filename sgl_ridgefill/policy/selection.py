"""Compiling a ``select`` statement: names through the selector registry, arguments through their
typed parameters, budgets into limits. Produces a ``SelectionPlan``."""

from __future__ import annotations

from collections.abc import Callable

from sgl_ridgefill.selectors.registry import SELECTORS, UnknownNameError
from sgl_ridgefill.selectors.spec import ArgumentError, BindContext, SelectorSpec

from . import ast
from .arguments import convert_args
from .errors import PolicyError, Span, did_you_mean
from .formatter import format_literal
from .plan import CountLimit, Limit, Node, SelectionPlan, SelectorNode, SetOpNode, ShareLimit, SizeLimit, TopNode

Fail = Callable[[str, "Span | None"], PolicyError]

# Names people reach for instead of the operators.
_OPERATOR_NAMES = {"union": "|", "intersect": "&", "intersection": "&", "difference": "-", "minus": "-"}


class _SelectionCompiler:
    def __init__(self, context: BindContext, fail: Fail) -> None:
        self.context = context
        self.fail = fail

    def spec(self, call: ast.Call) -> SelectorSpec:
        try:
            return SELECTORS.get(call.name)
        except UnknownNameError as err:
            if call.name in _OPERATOR_NAMES:
                hint = f"; write set operations with |, & and - (here: {_OPERATOR_NAMES[call.name]})"
            else:
                hint = did_you_mean(call.name, err.known) or f"; known selectors: {', '.join(err.known)}"
            raise self.fail(f"unknown selector {call.name!r}{hint}", call.name_span) from None

    def call(self, call: ast.Call) -> SelectorNode:
        spec = self.spec(call)
        args = convert_args(call, spec.params, self.fail)
        try:
            bound = spec.bind(args, self.context)
        except ArgumentError as err:
            arg = next((a for a in call.args if a.name == err.param), None) if err.param else None
            raise self.fail(str(err), arg.value.span if arg is not None else call.span) from None
        return SelectorNode(bound)

    def expr(self, expr: ast.Expr) -> Node:
        if isinstance(expr, ast.Call):
            return self.call(expr)
        if isinstance(expr, ast.Top):
            operand = self.expr(expr.operand)
            return TopNode(operand, self.limit(expr.limit, "top"))
        return SetOpNode(expr.op, self.expr(expr.left), self.expr(expr.right))

    def limit(self, budget: ast.Budget, where: str) -> Limit:
        if isinstance(budget, ast.SizeBudget):
            factor = 1.0
            if budget.factor is not None:
                if isinstance(budget.factor, ast.PercentLit) or not budget.factor.value > 0:
                    raise self.fail(
                        f"the factor before size(...) must be a positive number such as 1.0, got "
                        f"{format_literal(budget.factor)}",
                        budget.factor.span,
                    )
                factor = float(budget.factor.value)
            self.bounded(budget.operand, "size(...)")
            return SizeLimit(factor, self.expr(budget.operand))
        value = budget.value
        if isinstance(value, ast.PercentLit):
            if not 0.0 <= value.value <= 100.0:
                raise self.fail(f"a {where} percentage must be between 0% and 100%, got {format_literal(value)}", value.span)
            return ShareLimit(value.fraction)
        if isinstance(value, ast.IntLit):
            if value.value < 0:
                raise self.fail(f"a {where} count must be at least 0 rows, got {value.value}", value.span)
            return CountLimit(value.value)
        raise self.fail(
            f"a {where} is a percentage (10%) or a whole number of rows (256), got {format_literal(value)}", value.span
        )

    def unbounded_call(self, expr: ast.Expr) -> ast.Call | None:
        """A selector that ranks every prefix row and reaches the result uncut, if any."""
        if isinstance(expr, ast.Call):
            return expr if self.spec(expr).ranks_all else None
        if isinstance(expr, ast.Top):
            return None
        left, right = self.unbounded_call(expr.left), self.unbounded_call(expr.right)
        if expr.op == "|":
            return left or right
        if expr.op == "&":
            return left if (left and right) else None
        return left

    def bounded(self, expr: ast.Expr, where: str) -> None:
        call = self.unbounded_call(expr)
        if call is not None:
            raise self.fail(
                f"{call.name}() ranks every prefix row, so {where} would take the whole prefix; "
                f"cut it with top({call.name}(...), 10%)" + (" or a budget" if where == "select" else ""),
                call.span,
            )


def compile_selection(stmt: ast.SelectStmt, context: BindContext, fail: Fail) -> SelectionPlan:
    """The plan for one ``select`` statement, or a ``PolicyError`` pointing at the problem."""
    c = _SelectionCompiler(context, fail)
    if len(stmt.budgets) > 1:
        raise fail("select has a second budget; give one", stmt.budgets[1].span)
    if len(stmt.plus) > 1:
        raise fail("select has a second plus clause; join the rows with |, e.g. plus a() | b()", stmt.plus[1].span)
    if stmt.reserves and not stmt.budgets:
        raise fail("reserve sets rows aside inside a budget, and this select has none; add e.g. budget 10%", stmt.reserves[0].span)
    rows = c.expr(stmt.rows)
    budget = c.limit(stmt.budgets[0], "budget") if stmt.budgets else None
    if budget is None:
        c.bounded(stmt.rows, "select")
    reserves = tuple((c.expr(r.rows), c.limit(r.limit, "reserve")) for r in stmt.reserves)
    plus = None
    if stmt.plus:
        c.bounded(stmt.plus[0], "plus")
        plus = c.expr(stmt.plus[0])
    return SelectionPlan(rows, budget, reserves, plus)
