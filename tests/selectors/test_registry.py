from __future__ import annotations

import pathlib
import re

import pytest

from sgl_ridgefill.selectors.registry import RESERVED_NAMES, SELECTORS, Registry, UnknownNameError
from sgl_ridgefill.selectors.spec import SelectorSpec

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILT_IN = {"attention_topk", "protected_classes", "lexical_net", "digits", "special_tokens", "random", "probe"}


def test_every_built_in_selector_is_registered_and_documented():
    assert set(SELECTORS.names()) == BUILT_IN
    for name in SELECTORS:
        spec = SELECTORS.get(name)
        assert spec.name == name
        assert spec.summary and spec.summary[0].isupper()


def test_duplicates_and_reserved_words_are_refused():
    reg = Registry("selector")

    def fn(inputs):
        """Doc."""

    reg.add("a", SelectorSpec("a", fn))
    with pytest.raises(ValueError, match="selector 'a' is already registered"):
        reg.add("a", SelectorSpec("a", fn))
    with pytest.raises(ValueError, match="'top' is a reserved word"):
        reg.add("top", SelectorSpec("top", fn))
    with pytest.raises(ValueError, match="needs a docstring"):
        SelectorSpec("b", lambda inputs: None)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as err:
        SELECTORS.get("nope")
    assert str(err.value) == (
        "unknown selector 'nope'; known selectors: attention_topk, digits, lexical_net, probe, "
        "protected_classes, random, special_tokens"
    )


def test_reserved_names_match_the_grammar_keywords():
    grammar = (REPO / "sgl_ridgefill" / "policy" / "rfpolicy.lark").read_text()
    keywords = {w for w in re.findall(r'"([a-z_]+)"', grammar)}
    assert keywords == set(RESERVED_NAMES)
