"""Hypothesis strategies for ``.rfpolicy`` input: policy trees biased toward names the compiler knows, and
policy texts (formatted trees, random text, random token sequences, shipped policies with random edits).

The policy tests and ``sgl-ridgefill soak --fuzz`` draw from here. Needs ``hypothesis`` (a test
dependency), imported only by this module.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..selectors.registry import RESERVED_NAMES, SELECTORS
from . import ast
from .builtin import builtin_policy_names, builtin_policy_path
from .formatter import format_policy

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
    st.builds(
        lambda value, length, leading, trailing: ast.SplitStmt(value, from_tokens=length, leading=leading,
                                                               trailing=trailing),
        st.one_of(st.integers(-3, 70).map(ast.IntLit), numbers),
        st.one_of(st.none(), st.integers(-1, 200_000).map(ast.IntLit), numbers),
        comments,
        trailing,
    ),
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



# ----------------------------------------------------------------------------- texts
PIECES = [
    "policy", '"p"', "{", "}", "arm", "ridgefill", "exact", "split", "tail", "cache", "select", "budget", "reserve",
    "up", "to", "plus", "from", "tokens", "correct", "top", "size", "(", ")", ",", "=", "|", "&", "-", "*", "[", "]",
    "12", "5%", "-1", "0.5", "1e999", "true", '"x\\"y"', "probe", "digits", "attention_topk", "q", "share", "value_rescale", "c", "#", "\n",
]


def shipped_texts() -> list[str]:
    return [builtin_policy_path(n).read_text(encoding="utf-8") for n in builtin_policy_names()]


random_texts = st.text(max_size=200)
token_sequences = st.builds(
    lambda framed, text: f'policy "p" {{ {text} }}' if framed else text,
    st.booleans(), st.lists(st.sampled_from(PIECES), max_size=40).map(" ".join),
)


@st.composite
def mutated_shipped(draw):
    """A shipped policy with one to four random inserts, deletions, replacements or duplications."""
    text = draw(st.sampled_from(shipped_texts()))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        piece = draw(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[j:]
        elif op == "replace":
            text = text[:i] + piece + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


policy_texts = st.one_of(policies.map(format_policy), random_texts, token_sequences, mutated_shipped())
