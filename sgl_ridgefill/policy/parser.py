"""Text -> ``PolicyAst``: a cached LALR parser for ``rfpolicy.lark`` and a transformer to dataclasses.

The Lark tree never leaves this module, and every failure leaves it as a ``PolicyError`` with a caret.
Comments are not part of the grammar's tree; they are found by a scan that skips strings (the only
other tokens that may hold ``#``) and attached to the statement they precede or trail.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.resources
import math
import os
import re

from lark import Lark, Token
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr
from lark.visitors import Transformer_NonRecursive, v_args

from . import ast
from .errors import PolicyError, Span, did_you_mean

GRAMMAR_FILE = "rfpolicy.lark"
# Deeper expressions are refused: formatting and compiling recurse once per level.
MAX_DEPTH = 100

_TERMINAL_WORDS = {"NAME": "a name", "NUMBER": "a number", "STRING": "a string", "$END": "end of file"}
_COMMENT_SCAN = re.compile(r'"(?:[^"\\\r\n]|\\["\\])*"|#[^\r\n]*')
_ESCAPE = re.compile(r"\\([\"\\])")


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = importlib.resources.files(__package__).joinpath(GRAMMAR_FILE).read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _token_span(tok: Token, filename: str) -> Span:
    return Span(filename, tok.line, tok.column, tok.end_line, tok.end_column, tok.start_pos, tok.end_pos)


def _line_starts(text: str) -> list[int]:
    """The offset at which each line of ``text`` starts (the first is 0)."""
    return [0, *(m.end() for m in re.finditer("\n", text))]


def _offset_span(text: str, start: int, end: int, filename: str, line_starts: list[int] | None = None) -> Span:
    """The span of ``text[start:end]``; pass ``_line_starts(text)`` when placing many spans in one text."""
    if line_starts is None:
        line_starts = _line_starts(text)
    line = bisect.bisect_right(line_starts, start)
    end_line = bisect.bisect_right(line_starts, end)
    return Span(filename, line, start - line_starts[line - 1] + 1, end_line, end - line_starts[end_line - 1] + 1, start, end)


@v_args(meta=True)
class _AstBuilder(Transformer_NonRecursive):
    """Lark tree -> ast dataclasses (children arrive already transformed)."""

    def __init__(self, filename: str, source: str) -> None:
        super().__init__()
        self.filename = filename
        self.source = source
        self._depth: dict[int, int] = {}

    # -- helpers ----------------------------------------------------------------------------------
    def _span(self, meta) -> Span | None:
        if getattr(meta, "empty", True):
            return None
        return Span(self.filename, meta.line, meta.column, meta.end_line, meta.end_column, meta.start_pos, meta.end_pos)

    def _error(self, message: str, span: Span | None) -> PolicyError:
        return PolicyError(message, span=span, source=self.source, filename=self.filename)

    def _nest(self, node, children, span):
        depth = 1 + max((self._depth.get(id(c), 0) for c in children), default=0)
        if depth > MAX_DEPTH:
            raise self._error(f"expression nests more than {MAX_DEPTH} levels deep", span)
        self._depth[id(node)] = depth
        return node

    def _number(self, tok: Token) -> ast.Number:
        span = _token_span(tok, self.filename)
        text = str(tok)
        body = text[:-1] if text.endswith("%") else text
        try:
            if text.endswith("%"):
                node = ast.PercentLit(float(body), span)
            elif any(c in body for c in ".eE"):
                node = ast.FloatLit(float(body), span)
            else:
                node = ast.IntLit(int(body), span)
        except ValueError:
            raise self._error(f"number {text[:20]}... has too many digits", span) from None
        if isinstance(node, (ast.FloatLit, ast.PercentLit)) and not math.isfinite(node.value):
            raise self._error(f"number {text} is too large", span)
        return node

    # -- file and statements ------------------------------------------------------------------------
    def start(self, meta, children):
        name_tok, *statements = children
        return ast.PolicyAst(
            name=self._string_value(name_tok),
            statements=tuple(statements),
            span=self._span(meta),
            name_span=_token_span(name_tok, self.filename),
            source=self.source,
        )

    def arm(self, meta, children):
        return ast.ArmStmt(str(children[0]), self._span(meta), _token_span(children[0], self.filename))

    def cache(self, meta, children):
        return ast.CacheStmt(str(children[0]), self._span(meta), _token_span(children[0], self.filename))

    def split(self, meta, children):
        value, *length = children  # ``from N tokens`` gives the second NUMBER
        return ast.SplitStmt(self._number(value), self._span(meta),
                             from_tokens=self._number(length[0]) if length else None)

    def tail(self, meta, children):
        return ast.TailStmt(self._number(children[0]), self._span(meta))

    def correct(self, meta, children):
        return ast.CorrectStmt(children[0], self._span(meta))

    def select(self, meta, children):
        rows, *clauses = children
        return ast.SelectStmt(
            rows=rows,
            budgets=tuple(c[1] for c in clauses if c[0] == "budget"),
            reserves=tuple(c[1] for c in clauses if c[0] == "reserve"),
            plus=tuple(c[1] for c in clauses if c[0] == "plus"),
            span=self._span(meta),
        )

    def budget_clause(self, meta, children):
        return ("budget", children[0])

    def reserve_clause(self, meta, children):
        return ("reserve", ast.Reserve(children[0], children[1], self._span(meta)))

    def plus_clause(self, meta, children):
        return ("plus", children[0])

    # -- budgets and expressions --------------------------------------------------------------------
    def fixed_budget(self, meta, children):
        return ast.FixedBudget(self._number(children[0]), self._span(meta))

    def size_budget(self, meta, children):
        factor = self._number(children[0]) if len(children) == 2 else None
        operand = children[-1]
        return self._nest(ast.SizeBudget(factor, operand, self._span(meta)), [operand], self._span(meta))

    def _set_op(self, op, meta, children):
        left, right = children
        return self._nest(ast.SetOp(op, left, right, self._span(meta)), children, self._span(meta))

    def union_op(self, meta, children):
        return self._set_op("|", meta, children)

    def inter_op(self, meta, children):
        return self._set_op("&", meta, children)

    def diff_op(self, meta, children):
        return self._set_op("-", meta, children)

    def top(self, meta, children):
        operand, limit = children
        return self._nest(ast.Top(operand, limit, self._span(meta)), children, self._span(meta))

    def call(self, meta, children):
        name, *args = children
        node = ast.Call(str(name), tuple(args), self._span(meta), _token_span(name, self.filename))
        return self._nest(node, [a.value for a in args], self._span(meta))

    def kwarg(self, meta, children):
        name, value = children
        return ast.Arg(str(name), value, self._span(meta), _token_span(name, self.filename))

    def posarg(self, meta, children):
        return ast.Arg(None, children[0], self._span(meta))

    # -- literals -----------------------------------------------------------------------------------
    def _string_value(self, tok: Token) -> str:
        return _ESCAPE.sub(r"\1", str(tok)[1:-1])

    def number(self, meta, children):
        return self._number(children[0])

    def string(self, meta, children):
        return ast.StrLit(self._string_value(children[0]), self._span(meta))

    def true(self, meta, children):
        return ast.BoolLit(True, self._span(meta))

    def false(self, meta, children):
        return ast.BoolLit(False, self._span(meta))

    def list(self, meta, children):
        node = ast.ListLit(tuple(children), self._span(meta))
        return self._nest(node, children, self._span(meta))


# ---- syntax errors ----------------------------------------------------------------------------------


def _terminal_word(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name.lower()
    return repr(pattern.value) if isinstance(pattern, PatternStr) else name.lower()


def _keyword_names(expected: set[str]) -> list[str]:
    words = []
    for name in expected:
        try:
            pattern = _parser().get_terminal(name).pattern
        except KeyError:
            continue
        if isinstance(pattern, PatternStr) and pattern.value.isidentifier():
            words.append(pattern.value)
    return words


def _expected_text(expected: set[str]) -> str:
    words = sorted({_terminal_word(n) for n in expected})
    if not words:
        return ""
    return f"; expected {words[0]}" if len(words) == 1 else f"; expected one of {', '.join(words)}"


def _describe_token(tok: Token) -> str:
    if tok.type == "NAME":
        return f"name {str(tok)!r}"
    if tok.type in ("NUMBER", "STRING"):
        return f"{tok.type.lower()} {str(tok)}"
    return repr(str(tok))


def _syntax_error(err: UnexpectedInput, text: str, filename: str) -> PolicyError:
    if isinstance(err, UnexpectedToken) and err.token.type == "$END":
        end = len(text.rstrip())
        span = _offset_span(text, end, end + 1, filename)
        message = "unexpected end of file" + _expected_text(set(err.expected))
    elif isinstance(err, UnexpectedToken):
        tok = err.token
        span = _token_span(tok, filename)
        hint = did_you_mean(str(tok), _keyword_names(set(err.expected))) if tok.type == "NAME" else ""
        if tok.type == "LPAR" and set(err.expected) == {"EQUAL"}:
            # name( inside an argument list: a selector used as an argument.
            hint = "; arguments are name=value; combine selectors with |, & and -, or cut one with top(...)"
        message = f"unexpected {_describe_token(tok)}" + (hint or _expected_text(set(err.expected)))
    elif isinstance(err, UnexpectedCharacters):
        pos = err.pos_in_stream
        span = _offset_span(text, pos, pos + 1, filename)
        word = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[pos:])
        if word:
            # A name where only keywords fit: the contextual lexer has no NAME rule here.
            hint = did_you_mean(word.group(), _keyword_names(set(err.allowed or ())))
            span = _offset_span(text, pos, pos + len(word.group()), filename)
            message = f"unexpected name {word.group()!r}" + (hint or _expected_text(set(err.allowed or ())))
        elif text[pos] == '"':
            message = 'string is not closed on this line, or holds an escape other than \\" and \\\\'
        else:
            message = f"unexpected character {text[pos]!r}" + _expected_text(set(err.allowed or ()))
    else:
        return PolicyError(f"cannot parse policy: {err}", filename=filename)
    return PolicyError(message, span=span, source=text, filename=filename)


# ---- comments ---------------------------------------------------------------------------------------


def _attach_comments(policy: ast.PolicyAst, text: str, filename: str) -> ast.PolicyAst:
    """Comments onto the statements they sit on: O((comments + statements) log(lines + statements))."""
    found = [m for m in _COMMENT_SCAN.finditer(text) if m.group().startswith("#")]
    if not found:
        return policy
    lines = _line_starts(text)
    comments = [ast.Comment(m.group()[1:].rstrip(), _offset_span(text, m.start(), m.end(), filename, lines)) for m in found]
    statements = list(policy.statements)
    leading: list[list[ast.Comment]] = [[] for _ in statements]
    trailing: list[ast.Comment | None] = [None] * len(statements)
    head, footer, tail = [], [], []
    # Statements follow each other in the text, so their ends ascend: the statements that end at or
    # before a comment are a prefix, found by bisection (O(log n) per comment).
    ends = [s.span.end for s in statements]
    assert ends == sorted(ends), "statements out of text order"
    for c in comments:
        pos = c.span.start
        if pos < policy.span.start:
            head.append(c)
            continue
        if pos >= policy.span.end:
            tail.append(c)
            continue
        after = bisect.bisect_right(ends, pos)  # first statement ending after the comment
        if after > 0 and statements[after - 1].span.end_line == c.span.line:
            trailing[after - 1] = c
            continue
        (footer if after == len(statements) else leading[after]).append(c)
    new_statements = tuple(
        dataclasses.replace(s, leading=tuple(leading[i]), trailing=trailing[i]) for i, s in enumerate(statements)
    )
    return dataclasses.replace(
        policy, statements=new_statements, leading=tuple(head), footer=tuple(footer), trailing=tuple(tail)
    )


# ---- entry points -----------------------------------------------------------------------------------


def parse_policy(text: str, filename: str = "<policy>") -> ast.PolicyAst:
    """Parse ``.rfpolicy`` text. Raises ``PolicyError`` (and nothing else) for any bad input."""
    if not isinstance(text, str):
        raise PolicyError(f"policy text must be a str, got {type(text).__name__}", filename=filename)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        raise _syntax_error(err, text, filename) from None
    except LarkError as err:
        raise PolicyError(f"cannot parse policy: {err}", filename=filename) from None
    try:
        policy = _AstBuilder(filename, text).transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, PolicyError):
            raise err.orig_exc from None
        raise
    return _attach_comments(policy, text, filename)


def load_policy(path: str | os.PathLike) -> ast.PolicyAst:
    """Read and parse a ``.rfpolicy`` file (UTF-8)."""
    filename = os.fspath(path)
    try:
        with open(filename, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise PolicyError(f"policy file is not UTF-8 text ({err.reason} at byte {err.start})", filename=filename) from None
    except OSError as err:
        raise PolicyError(f"cannot read policy file: {err.strerror or err}", filename=filename) from None
    return parse_policy(text, filename)
