"""The grammar, construct by construct, against hand-written trees."""

from __future__ import annotations

from sgl_ridgefill.policy import ast
from sgl_ridgefill.policy.ast import (
    Arg,
    ArmStmt,
    BoolLit,
    CacheStmt,
    Call,
    Comment,
    CorrectStmt,
    FixedBudget,
    FloatLit,
    IntLit,
    ListLit,
    PercentLit,
    PolicyAst,
    Reserve,
    SelectStmt,
    SetOp,
    SizeBudget,
    SplitStmt,
    StrLit,
    TailStmt,
    Top,
)

from .helpers import parse


def call(name, **kw):
    return Call(name, tuple(Arg(k, v) for k, v in kw.items()))


def body(policy: PolicyAst):
    return policy.statements


def test_empty_policy():
    assert parse('policy "p" {}') == PolicyAst("p", ())


def test_simple_statements():
    p = parse('policy "p" {\n  arm identity\n  split 12\n  tail 4096\n  cache namespace\n}')
    assert body(p) == (ArmStmt("identity"), SplitStmt(IntLit(12)), TailStmt(IntLit(4096)), CacheStmt("namespace"))


def test_every_literal_kind():
    p = parse('policy "p" { correct x(a=1, b=2.5, c=5%, d="s", e=true, f=false, g=[1, [2]], h=-3, i=1e3, j=.5, k=-0.5%) }')
    assert body(p) == (
        CorrectStmt(
            call(
                "x", a=IntLit(1), b=FloatLit(2.5), c=PercentLit(5.0), d=StrLit("s"), e=BoolLit(True), f=BoolLit(False),
                g=ListLit((IntLit(1), ListLit((IntLit(2),)))), h=IntLit(-3), i=FloatLit(1000.0), j=FloatLit(0.5),
                k=PercentLit(-0.5),
            )
        ),
    )


def test_positional_arguments_and_trailing_commas_parse():
    p = parse('policy "p" { correct x(1, "a",) }')
    assert body(p) == (CorrectStmt(Call("x", (Arg(None, IntLit(1)), Arg(None, StrLit("a"))))),)


def test_set_operator_precedence_follows_python():
    a, b, c, d = call("a"), call("b"), call("c"), call("d")
    assert body(parse('policy "p" { select a() | b() & c() - d() }'))[0].rows == SetOp("|", a, SetOp("&", b, SetOp("-", c, d)))
    assert body(parse('policy "p" { select a() - b() - c() }'))[0].rows == SetOp("-", SetOp("-", a, b), c)
    assert body(parse('policy "p" { select (a() | b()) & c() }'))[0].rows == SetOp("&", SetOp("|", a, b), c)
    assert body(parse('policy "p" { select a() - (b() - c()) }'))[0].rows == SetOp("-", a, SetOp("-", b, c))


def test_select_clauses_budgets_and_top():
    p = parse(
        'policy "p" { select top(a(), 50%) budget 2 * size(b() | c()) reserve d() up to 5% reserve e() up to 3 plus f() }'
    )
    assert body(p) == (
        SelectStmt(
            rows=Top(call("a"), FixedBudget(PercentLit(50.0))),
            budgets=(SizeBudget(IntLit(2), SetOp("|", call("b"), call("c"))),),
            reserves=(Reserve(call("d"), FixedBudget(PercentLit(5.0))), Reserve(call("e"), FixedBudget(IntLit(3)))),
            plus=(call("f"),),
        ),
    )
    assert body(parse('policy "p" { select a() budget size(b()) }'))[0].budgets == (SizeBudget(None, call("b")),)
    assert body(parse('policy "p" { select a() budget 10 }'))[0].budgets == (FixedBudget(IntLit(10)),)


def test_clauses_are_grouped_by_kind_in_written_order():
    p = parse('policy "p" { select a() plus b() budget 5% reserve c() up to 1% budget 7 }')
    stmt = body(p)[0]
    assert stmt.budgets == (FixedBudget(PercentLit(5.0)), FixedBudget(IntLit(7)))
    assert stmt.plus == (call("b"),)


def test_keywords_may_name_arguments():
    p = parse('policy "p" { select x(plus=1, top=2, size=3) }')
    assert body(p)[0].rows == call("x", plus=IntLit(1), top=IntLit(2), size=IntLit(3))


def test_string_escapes():
    assert parse(r'policy "a\"b\\c" {}').name == 'a"b\\c'


def test_spans_point_at_the_source():
    p = parse('policy "p" {\n  split 12\n  select attention_topk(q=64)\n}')
    split, select = body(p)
    assert (split.span.line, split.span.column, split.span.end_column) == (2, 3, 11)
    assert (split.value.span.line, split.value.span.column) == (2, 9)
    name = select.rows.name_span
    assert (name.line, name.column, name.end_column) == (3, 10, 24)
    arg = select.rows.args[0]
    assert (arg.name_span.column, arg.value.span.column) == (25, 27)
    assert p.span.filename == "p.rfpolicy" and p.filename == "p.rfpolicy"


def test_comments_attach_to_statements():
    text = (
        "# head\n"
        'policy "p" {  # first-line\n'
        "  arm ridgefill  # trails arm\n"
        "  # before split\n"
        "  split 12\n"
        "  select a()\n"
        "    # inside select\n"
        "    budget 5%  # trails select\n"
        "  # footer\n"
        "}  # after brace\n"
        "# tail\n"
    )
    p = parse(text)
    arm, split, select = p.statements
    assert p.leading == (Comment(" head"),)
    assert arm.leading == (Comment(" first-line"),) and arm.trailing == Comment(" trails arm")
    assert split.leading == (Comment(" before split"),) and split.trailing is None
    assert select.leading == (Comment(" inside select"),) and select.trailing == Comment(" trails select")
    assert p.footer == (Comment(" footer"),)
    assert p.trailing == (Comment(" after brace"), Comment(" tail"))


def test_hash_inside_a_string_is_not_a_comment():
    p = parse('policy "p" { correct x(path="a#b") }  # real')
    assert body(p)[0].call.args[0].value == StrLit("a#b")
    assert p.trailing == (Comment(" real"),)


def test_equality_ignores_layout_and_number_spelling():
    a = parse('policy "p" {\n  select top(a(), 5%)\n}')
    b = parse('policy "p" { select top((a()), 5.0%) }')
    assert a == b
    assert a != parse('policy "p" { select top(a(), 6%) }')
    assert isinstance(a.statements[0].rows, ast.Top)
