"""Hypothesis strategies for policy trees, biased toward names the compiler knows."""

from __future__ import annotations

from hypothesis import strategies as st

from sgl_ridgefill.policy import ast
from sgl_ridgefill.selectors.registry import RESERVED_NAMES, SELECTORS

KNOWN_NAMES = list(SELECTORS.names()) + ["value_rescale", "terminal_state"]
PARAM_NAMES = ["q", "share", "layers", "query", "rows", "count", "c", "offsets", "min_shared", "stopwords"]

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(lambda s: s not in RESERVED_NAMES)
names = st.one_of(st.sampled_from(KNOWN_NAMES), identifiers)
arg_names = st.one_of(st.sampled_from(PARAM_NAMES), identifiers)
comment_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20).map(str.rstrip)
string_values = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

ints = st.integers(-(2**63), 2**63).map(ast.IntLit)
floats = finite.map(ast.FloatLit)
percents = st.one_of(st.integers(-200, 200).map(float), finite).map(ast.PercentLit)
numbers = st.one_of(ints, floats, percents)
scalars = st.one_of(numbers, string_values.map(ast.StrLit), st.booleans().map(ast.BoolLit))
literals = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3).map(lambda xs: ast.ListLit(tuple(xs))), max_leaves=6)

args = st.builds(ast.Arg, st.one_of(st.none(), arg_names), literals)
calls = st.builds(ast.Call, names, st.lists(args, max_size=3).map(tuple))


def _budgets(exprs):
    return st.one_of(
        numbers.map(ast.FixedBudget),
        st.builds(ast.SizeBudget, st.one_of(st.none(), numbers), exprs),
    )


def _extend(exprs):
    return st.one_of(
        st.builds(ast.SetOp, st.sampled_from("|&-"), exprs, exprs),
        st.builds(ast.Top, exprs, _budgets(exprs)),
    )


expressions = st.recursive(calls, _extend, max_leaves=6)
budgets = _budgets(expressions)
comments = st.lists(comment_text.map(ast.Comment), max_size=2).map(tuple)
trailing = st.one_of(st.none(), comment_text.map(ast.Comment))


def _stmt(cls, *fields):
    return st.builds(lambda *values: cls(*values[:-2], leading=values[-2], trailing=values[-1]), *fields, comments, trailing)


statements = st.one_of(
    _stmt(ast.ArmStmt, st.one_of(st.sampled_from(["ridgefill", "identity", "nofill", "exact"]), identifiers)),
    _stmt(ast.SplitStmt, st.one_of(st.integers(-3, 70).map(ast.IntLit), numbers)),
    _stmt(ast.TailStmt, st.one_of(st.integers(-3, 9000).map(ast.IntLit), numbers)),
    _stmt(ast.CacheStmt, st.one_of(st.sampled_from(["no_insert", "namespace"]), identifiers)),
    _stmt(ast.CorrectStmt, calls),
    _stmt(
        ast.SelectStmt,
        expressions,
        st.lists(budgets, max_size=2).map(tuple),
        st.lists(st.builds(ast.Reserve, expressions, budgets), max_size=2).map(tuple),
        st.lists(expressions, max_size=2).map(tuple),
    ),
)

policies = st.builds(
    ast.PolicyAst,
    name=st.one_of(st.from_regex(r"[a-z0-9][a-z0-9.-]{0,10}", fullmatch=True), string_values),
    statements=st.lists(statements, max_size=7).map(tuple),
    leading=comments,
    footer=comments,
    trailing=comments,
)

