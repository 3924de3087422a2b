"""``PolicyAst`` -> canonical ``.rfpolicy`` text.

One statement per line, clauses of ``select`` on their own lines, two-space indentation, comments kept
(a comment inside a multi-line statement moves above it). Parentheses are written only where the tree
needs them, so ``parse_policy(format_policy(x)) == x`` for every parsed ``x``.
"""

from __future__ import annotations

from . import ast

_INDENT = "  "
# Clauses of a select statement sit one level deeper than the statement.
_CLAUSE = "  "


def _float(value: float) -> str:
    return repr(float(value))


def format_literal(lit: ast.Literal) -> str:
    """A literal as canonical source text (``5%``, ``0.03``, ``"last"``, ``[3, 7]``)."""
    if isinstance(lit, ast.BoolLit):
        return "true" if lit.value else "false"
    if isinstance(lit, ast.IntLit):
        return str(lit.value)
    if isinstance(lit, ast.FloatLit):
        return _float(lit.value)
    if isinstance(lit, ast.PercentLit):
        v = float(lit.value)
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v)}%"
        return f"{_float(v)}%"
    if isinstance(lit, ast.StrLit):
        return '"' + lit.value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(lit, ast.ListLit):
        return "[" + ", ".join(format_literal(i) for i in lit.items) + "]"
    raise TypeError(f"not a policy literal: {lit!r}")


def format_call(call: ast.Call) -> str:
    args = ", ".join(
        format_literal(a.value) if a.name is None else f"{a.name}={format_literal(a.value)}" for a in call.args
    )
    return f"{call.name}({args})"


def format_budget(budget: ast.Budget) -> str:
    if isinstance(budget, ast.FixedBudget):
        return format_literal(budget.value)
    size = f"size({format_expr(budget.operand)})"
    return size if budget.factor is None else f"{format_literal(budget.factor)} * {size}"


def format_expr(expr: ast.Expr) -> str:
    """A row expression; a nested set operation is parenthesised unless it is the same operator on the
    left (left-associative chains stay flat)."""
    if isinstance(expr, ast.Call):
        return format_call(expr)
    if isinstance(expr, ast.Top):
        return f"top({format_expr(expr.operand)}, {format_budget(expr.limit)})"
    left = format_expr(expr.left)
    if isinstance(expr.left, ast.SetOp) and expr.left.op != expr.op:
        left = f"({left})"
    right = format_expr(expr.right)
    if isinstance(expr.right, ast.SetOp):
        right = f"({right})"
    return f"{left} {expr.op} {right}"


def _statement_lines(stmt: ast.Statement) -> list[str]:
    if isinstance(stmt, ast.ArmStmt):
        return [f"arm {stmt.value}"]
    if isinstance(stmt, ast.CacheStmt):
        return [f"cache {stmt.value}"]
    if isinstance(stmt, ast.SplitStmt):
        length = "" if stmt.from_tokens is None else f" from {format_literal(stmt.from_tokens)} tokens"
        return [f"split {format_literal(stmt.value)}{length}"]
    if isinstance(stmt, ast.TailStmt):
        return [f"tail {format_literal(stmt.value)}"]
    if isinstance(stmt, ast.CorrectStmt):
        return [f"correct {format_call(stmt.call)}"]
    lines = [f"select {format_expr(stmt.rows)}"]
    lines += [f"{_CLAUSE}budget {format_budget(b)}" for b in stmt.budgets]
    lines += [
        f"{_CLAUSE}reserve {format_expr(r.rows)} up to {format_budget(r.limit)}" for r in stmt.reserves
    ]
    lines += [f"{_CLAUSE}plus {format_expr(p)}" for p in stmt.plus]
    return lines


def _comment(c: ast.Comment) -> str:
    return f"#{c.text}"


def format_policy(policy: ast.PolicyAst, *, comments: bool = True) -> str:
    """Canonical text of ``policy`` (ends with a newline). ``comments=False`` drops every comment."""
    out: list[str] = []
    if comments:
        out += [_comment(c) for c in policy.leading]
    out.append(f"policy {format_literal(ast.StrLit(policy.name))} {{")
    for stmt in policy.statements:
        if comments:
            out += [_INDENT + _comment(c) for c in stmt.leading]
        lines = [_INDENT + line for line in _statement_lines(stmt)]
        if comments and stmt.trailing is not None:
            lines[-1] += "  " + _comment(stmt.trailing)
        out += lines
    if comments:
        out += [_INDENT + _comment(c) for c in policy.footer]
    out.append("}")
    if comments:
        out += [_comment(c) for c in policy.trailing]
    return "\n".join(out) + "\n"
