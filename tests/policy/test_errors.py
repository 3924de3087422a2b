"""Exact user-facing messages: file, line, column, the line, a caret, and what to do."""

from __future__ import annotations

import pytest

from sgl_ridgefill.policy import MapsInfo, ModelInfo, PolicyError, builtin_policy_path, load_policy

from .helpers import error


def test_unknown_selector_with_did_you_mean():
    assert error('policy "p" {\n  split 12\n  select atention_topk(q=64)\n}\n') == (
        "p.rfpolicy:3:10: error: unknown selector 'atention_topk'; did you mean 'attention_topk'?\n"
        "   3 |   select atention_topk(q=64)\n"
        "     |          ^^^^^^^^^^^^^"
    )


def test_unknown_selector_far_from_any_lists_the_known_ones():
    assert error('policy "p" {\n  split 12\n  select zzz()\n}\n').splitlines()[0] == (
        "p.rfpolicy:3:10: error: unknown selector 'zzz'; known selectors: attention_topk, digits, lexical_net, "
        "probe, protected_classes, random, special_tokens"
    )


def test_syntax_error_with_caret():
    assert error('policy "p" {\n  split = 12\n}\n') == (
        "p.rfpolicy:2:9: error: unexpected '='; expected a number\n"
        "   2 |   split = 12\n"
        "     |         ^"
    )


def test_misspelt_keyword_gets_a_suggestion():
    assert error('policy "p" { spilt 12 }') == (
        "p.rfpolicy:1:14: error: unexpected name 'spilt'; did you mean 'split'?\n"
        '   1 | policy "p" { spilt 12 }\n'
        "     |              ^^^^^"
    )


def test_unexpected_end_of_file():
    assert error('policy "p" {\n  split 12\n') == (
        "p.rfpolicy:2:11: error: unexpected end of file; expected one of 'arm', 'cache', 'correct', 'from', "
        "'select', 'split', 'tail', '}'\n"
        "   2 |   split 12\n"
        "     |           ^"
    )


def test_selector_used_as_an_argument():
    assert error('policy "p" { select union(digits(), special_tokens()) }').splitlines()[0] == (
        "p.rfpolicy:1:33: error: unexpected '('; arguments are name=value; combine selectors with |, & and -, "
        "or cut one with top(...)"
    )


def test_wrong_argument_type():
    assert error('policy "p" {\n  split 12\n  select attention_topk(q="64")\n}\n') == (
        'p.rfpolicy:3:27: error: argument q of attention_topk() must be an integer, got the string "64"\n'
        '   3 |   select attention_topk(q="64")\n'
        "     |                           ^^^^"
    )
    assert error('policy "p" { split 12 select attention_topk(share=0.2) }').splitlines()[0] == (
        "p.rfpolicy:1:51: error: argument share of attention_topk() must be a percentage such as 25%, got the number 0.2"
    )


def test_out_of_range_fraction():
    assert error('policy "p" {\n  split 12\n  select attention_topk(share=150%)\n}\n') == (
        "p.rfpolicy:3:31: error: argument share of attention_topk() must be between 0% and 100%, got 150%\n"
        "   3 |   select attention_topk(share=150%)\n"
        "     |                               ^^^^"
    )
    assert error('policy "p" { split 12 select digits() budget 120% }').splitlines()[0] == (
        "p.rfpolicy:1:46: error: a budget percentage must be between 0% and 100%, got 120%"
    )


def test_value_rescale_without_c():
    assert error('policy "p" {\n  split 12\n  tail 4096\n  correct value_rescale()\n}\n') == (
        "p.rfpolicy:4:11: error: value_rescale() needs c, the number of tail rows that measure the scale, "
        "e.g. value_rescale(c=512)\n"
        "   4 |   correct value_rescale()\n"
        "     |           ^^^^^^^^^^^^^^^"
    )


def test_terminal_state_on_a_model_without_recurrent_layers():
    text = 'policy "p" {\n  split 12\n  correct terminal_state()\n}\n'
    assert error(text, model=ModelInfo.dense(32)) == (
        "p.rfpolicy:3:11: error: terminal_state() does not apply to this model: it has no recurrent "
        "(Gated DeltaNet) layers\n"
        "   3 |   correct terminal_state()\n"
        "     |           ^^^^^^^^^^^^^^^^"
    )


def test_split_absent_from_maps():
    assert error('policy "p" {\n  split 14\n}\n', maps=MapsInfo((12, 16), 12, 32)) == (
        "p.rfpolicy:2:9: error: split 14 has no maps in the maps folder, which has splits 12, 16\n"
        "   2 |   split 14\n"
        "     |         ^^"
    )


@pytest.mark.parametrize(
    "text, targets, first_line",
    [
        ('policy "p" {\n  arm ridgefil\n  split 12\n}', {}, "p.rfpolicy:2:7: error: unknown arm 'ridgefil'; did you mean 'ridgefill'?"),
        ('policy "p" {\n  split 12\n  cache namespce\n}', {}, "p.rfpolicy:3:9: error: unknown cache mode 'namespce'; did you mean 'namespace'?"),
        ('policy "p" {\n  split 12\n  tail 5\n  split 13\n}', {}, "p.rfpolicy:4:3: error: split is set twice (first at line 2)"),
        ('policy "p" {\n  split 12.5\n}', {}, "p.rfpolicy:2:9: error: split must be a whole number, got 12.5"),
        ('policy "p" {\n  split 40\n}', {"model": ModelInfo.dense(32)}, "p.rfpolicy:2:9: error: split 40 is out of range: the model has 32 layers (split 1 to 32)"),
        ('policy "p" {\n  tail 0\n  split 2\n}', {}, "p.rfpolicy:2:8: error: tail must be at least 1 row, got 0"),
        ('policy "p" {\n  arm ridgefill\n}', {}, "p.rfpolicy:1:8: error: split is not set and there is no maps folder to take a default from; add a line such as `split 12`"),
        ('policy "p" { split 12 select attention_topk(qq=64) }', {}, "p.rfpolicy:1:45: error: attention_topk() has no argument 'qq'; did you mean 'q'?"),
        ('policy "p" { split 12 select attention_topk(64) }', {}, "p.rfpolicy:1:45: error: arguments of attention_topk() are named, e.g. attention_topk(q=64)"),
        ('policy "p" { split 12 select attention_topk(q=1, q=2) }', {}, "p.rfpolicy:1:50: error: argument q of attention_topk() is given twice"),
        ('policy "p" { split 12 select attention_topk(query="befor_tail") }', {}, "p.rfpolicy:1:51: error: argument query of attention_topk() must be one of \"last\", \"before_tail\", got \"befor_tail\"; did you mean 'before_tail'?"),
        ('policy "p" { split 12 select attention_topk(layers=[3, 12]) }', {}, "p.rfpolicy:1:52: error: attention_topk(): layer 12 is not below split 12; attention statistics come from the layers every row runs exactly"),
        ('policy "p" { split 12 select probe() }', {}, "p.rfpolicy:1:30: error: probe() ranks every prefix row, so select would take the whole prefix; cut it with top(probe(...), 10%) or a budget"),
        ('policy "p" { split 12 select digits() plus probe() }', {}, "p.rfpolicy:1:44: error: probe() ranks every prefix row, so plus would take the whole prefix; cut it with top(probe(...), 10%)"),
        ('policy "p" { split 12 select digits() reserve digits() up to 5% }', {}, "p.rfpolicy:1:39: error: reserve sets rows aside inside a budget, and this select has none; add e.g. budget 10%"),
        ('policy "p" { split 12 select probe() budget 0.1 }', {}, "p.rfpolicy:1:45: error: a budget is a percentage (10%) or a whole number of rows (256), got 0.1"),
        ('policy "p" { split 12 select probe() budget 5% budget 6% }', {}, "p.rfpolicy:1:55: error: select has a second budget; give one"),
        ('policy "p" { split 12 select probe() budget 50% * size(digits()) }', {}, "p.rfpolicy:1:45: error: the factor before size(...) must be a positive number such as 1.0, got 50%"),
        ('policy "p" { split 12 select probe() budget -1 * size(digits()) }', {}, "p.rfpolicy:1:45: error: the factor before size(...) must be a positive number such as 1.0, got -1"),
        ('policy "p" { arm exact select digits() }', {}, "p.rfpolicy:1:24: error: arm exact computes every row exactly, so select has nothing to choose"),
        ('policy "p" { arm nofill split 4 correct value_rescale(c=8) }', {}, "p.rfpolicy:1:41: error: value_rescale() corrects filled rows, and arm nofill fills none"),
        ('policy "p" { split 12 tail 256 correct value_rescale(c=512) }', {}, "p.rfpolicy:1:40: error: value_rescale(c=512) needs at least 512 tail rows, but tail is 256"),
        ('policy "p" { split 12 correct value_rescal(c=5) }', {}, "p.rfpolicy:1:31: error: unknown correction 'value_rescal'; did you mean 'value_rescale'?"),
        ('policy "p" { split 12 correct terminal_state(offsets="../x") }', {}, "p.rfpolicy:1:31: error: terminal_state(offsets=...) must name a file inside the maps folder, got '../x'"),
        ('policy "bad name" { split 12 }', {}, "p.rfpolicy:1:8: error: policy name \"bad name\" must be 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or digit"),
        ('policy "p" { split 12 select union(a()) }', {}, "p.rfpolicy:1:37: error: unexpected '('; arguments are name=value; combine selectors with |, & and -, or cut one with top(...)"),
        ('policy "p" { split 12 select union() }', {}, "p.rfpolicy:1:30: error: unknown selector 'union'; write set operations with |, & and - (here: |)"),
        ('policy "p" { tail 1e999 }', {}, "p.rfpolicy:1:19: error: number 1e999 is too large"),
        ('policy "a\\n" {}', {}, 'p.rfpolicy:1:8: error: string is not closed on this line, or holds an escape other than \\" and \\\\'),
        ('policy "p" { split 2 correct terminal_state() }', {"model": ModelInfo.hybrid(8, attention_every=2)}, None),
    ],
)
def test_other_messages(text, targets, first_line):
    if first_line is None:  # recurrent layers above the split: accepted
        from sgl_ridgefill.policy import compile_policy, parse_policy

        assert compile_policy(parse_policy(text), **targets).terminal_state is not None
        return
    assert error(text, **targets).splitlines()[0] == first_line


def test_tabs_keep_the_caret_aligned():
    message = error('policy "p" {\n\tsplit\t"12"\n}\n')
    assert message.splitlines()[1:] == ['   2 |     split   "12"', "     |             ^^^^"]


def test_errors_are_value_errors_raised_without_the_parser_traceback():
    with pytest.raises(ValueError) as info:
        error_raising = 'policy "p" { split = }'
        from sgl_ridgefill.policy import parse_policy

        parse_policy(error_raising)
    assert isinstance(info.value, PolicyError)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert (info.value.line, info.value.column, info.value.filename) == (1, 20, "<policy>")


def test_files_and_shipped_names(tmp_path):
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "missing.rfpolicy")
    assert str(info.value) == f"{tmp_path / 'missing.rfpolicy'}: error: cannot read policy file: No such file or directory"
    binary = tmp_path / "b.rfpolicy"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(PolicyError, match="is not UTF-8 text"):
        load_policy(binary)
    with pytest.raises(PolicyError) as info:
        builtin_policy_path("qwen3.8-27")
    assert str(info.value) == "error: no shipped policy named 'qwen3.8-27'; did you mean 'qwen3.8-27b'?"
