from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.base import SelectionError
from sgl_ridgefill.selectors.token_classes import (
    LOWER_PIECE,
    MIXED,
    NO_CLASS,
    UPPER_PIECE,
    UPPER_START,
    digits,
    protected_classes,
    special_tokens,
    token_classes,
)
from sgl_ridgefill.selectors.tokens import TokenTable

from .helpers import inputs

VOCAB = [" The", " cat", "s", " Paris", " Zorg", "ington", " x86", " 42", ".", "Script", "<s>"]
COUNTS = torch.tensor([1000, 50, 500, 3, 0, 10, 2, 5, 2000, 7, 0])
#        0     1      2       3   4        5   6        7       8         9     10     11        12        13
PROMPT = [10, 0, 1, 2, 3, 8, 4, 5, 6, 7, 0, 9, 3, 8]
TABLE = TokenTable.from_pieces(VOCAB, special_ids=[10])


def _inputs(prefix_len=13, counts=COUNTS):
    return inputs(PROMPT, prefix_len, tokens=TABLE, token_counts=counts)


def test_token_classes_by_hand():
    # "s" follows " cat" and "ington" follows " Zorg": word pieces; "Script" follows " The": an uppercase
    # piece; " cat" is an ordinary lowercase word; "<s>" is special; " 42" and "." have no letters.
    assert token_classes(_inputs()).tolist() == [
        NO_CLASS, UPPER_START, NO_CLASS, LOWER_PIECE, UPPER_START, NO_CLASS, UPPER_START,
        LOWER_PIECE, MIXED, NO_CLASS, UPPER_START, UPPER_PIECE, UPPER_START,
    ]


def test_protected_classes_rarest_half_of_each_class():
    # Upper starts {1 The, 4 Paris, 6 Zorg, 10 The, 12 Paris}: round(2.5) = 3 rarest: Zorg (0+1),
    # Paris (3+1) at 4 then 12. Upper piece {11}: round(0.5) = 1. Lower pieces {3 s: 501, 7 ington: 11}:
    # 1 -> 7. Mixed {8}: 1. Ranked rarest first: Zorg 1, x86 3, Paris 4, Paris 4, Script 8, ington 11.
    assert protected_classes(_inputs(), share=0.5).tolist() == [6, 8, 4, 12, 11, 7]


def test_protected_classes_quarter():
    # round(1.25) = 1 upper start (Zorg); round(0.25) = 0 upper pieces and mixed; round(0.5) = 1 lower.
    assert protected_classes(_inputs(), share=0.25).tolist() == [6, 7]


def test_protected_classes_counts_shorter_than_the_vocabulary_count_as_unseen():
    # Only " The" has a count: every other token is unseen (add-one: 1) and ties go to the earlier row.
    # Upper starts: 3 of {1, 4, 6, 10, 12} -> the unseen 4, 6, 12; lower pieces: 1 of {3, 7} -> 3.
    rows = protected_classes(_inputs(counts=torch.tensor([9])), share=0.5).tolist()
    assert rows == [3, 4, 6, 8, 11, 12]


def test_digits_and_special_tokens():
    assert digits(_inputs()).tolist() == [9]
    assert special_tokens(_inputs()).tolist() == [0]
    assert digits(_inputs(prefix_len=9)).tolist() == []


def test_missing_vocabulary_facts_are_named():
    bare = inputs(PROMPT, 13)
    with pytest.raises(SelectionError, match=r"digits\(\) needs SelectionInputs.tokens"):
        digits(bare)
    with pytest.raises(SelectionError, match=r"protected_classes\(\) needs SelectionInputs.token_counts"):
        protected_classes(inputs(PROMPT, 13, tokens=TABLE), share=0.25)
