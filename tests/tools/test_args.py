"""The offline commands' shared argument types: each refuses bad text with a message naming the problem."""

from __future__ import annotations

import argparse

import pytest

from sgl_ridgefill.tools import args as argtypes


def _parse(kind, text: str):
    parser = argparse.ArgumentParser(prog="cmd", exit_on_error=False)
    parser.add_argument("--x", type=kind)
    return parser.parse_args(["--x", text]).x


def test_lists_of_integers_and_their_bounds():
    assert argtypes.token_counts("2048, 4096,") == (2048, 4096)
    assert argtypes.layers("0,12") == (0, 12)
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected comma-separated token counts like 2048,4096, got '2k'"):
        argtypes.token_counts("2k")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected token counts >= 1 .* got '0,4096'"):
        argtypes.token_counts("0,4096")
    with pytest.raises(argparse.ArgumentTypeError, match="expected token counts >= 1"):
        argtypes.token_counts(" , ")


def test_one_integer_with_or_without_auto():
    count = argtypes.integer(minimum=0)
    assert count("0") == 0
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer >= 0, got -1"):
        count("-1")
    auto = argtypes.integer(minimum=1, auto=True)
    assert auto("auto") is None and auto("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected auto or an integer >= 1, got 'many'"):
        auto("many")
    with pytest.raises(argparse.ArgumentTypeError, match="got 'auto'"):
        count("auto")


def test_choices_map_kinds_and_all():
    from sgl_ridgefill.maps.kinds import MAP_KINDS

    assert argtypes.map_kinds("all") == tuple(MAP_KINDS)
    assert argtypes.map_kinds("kv, residual") == ("kv", "residual")
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown map kind 'rsidual'; known: .*, or all"):
        argtypes.map_kinds("rsidual")
    with pytest.raises(argparse.ArgumentTypeError, match="expected map kinds like"):
        argtypes.map_kinds(",")
    assert argtypes.map_kind("kv") == "kv"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown map kind 'all'"):
        argtypes.map_kind("all")


def test_numbers_and_json():
    assert argtypes.positive_number_or_auto("auto") is None
    assert argtypes.positive_number_or_auto("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match="must be positive, got -2"):
        argtypes.positive_number_or_auto("-2")
    assert argtypes.json_object('{"tail": 2048}') == {"tail": 2048}
    with pytest.raises(argparse.ArgumentTypeError, match=r"not valid JSON"):
        argtypes.json_object("{tail")
    with pytest.raises(argparse.ArgumentTypeError, match="expected a JSON object"):
        argtypes.json_object("[1]")


def test_argparse_reports_the_flag_and_the_message():
    with pytest.raises(argparse.ArgumentError, match=r"argument --x: expected layer numbers >= 0"):
        _parse(argtypes.layers, "-1")


def test_parser_and_command_line():
    parser = argtypes.command_parser("sgl_ridgefill.tools.example", "First line.\n\nMore.")
    assert parser.prog == "python -m sgl_ridgefill.tools.example" and parser.description == "First line."
    whole = argtypes.command_parser("m", "First line.\n\nMore.", whole_doc=True)
    assert whole.description == "First line.\n\nMore."
    assert argtypes.command_line("python -m m", ["--out", "a b"]) == "python -m m --out 'a b'"
