"""Question-blind selectors that read only the tokens: protected classes, digits, special tokens."""

from __future__ import annotations

import torch

from .base import SelectionInputs
from .rows import empty_rows, pick, rank_ascending, rows_where, share_count, sorted_rows
from .spec import Param, SelectorSpec
from .tokens import CASE_LOWER, CASE_MIXED, CASE_UPPER

# Class ids for protected_classes. Lowercase word starts (ordinary words) belong to no class.
UPPER_START, UPPER_PIECE, LOWER_PIECE, MIXED = 0, 1, 2, 3
NO_CLASS = -1

# Seeds: the rarest 25 % of the four classes covered 3-10 % of prefix rows; about 0.26 of the share.
_CLASS_COVERAGE = 0.26
# Assumed for `policy explain` only: digit tokens in ordinary prose.
_TYPICAL_DIGIT_SHARE = 0.02


def token_classes(inputs: SelectionInputs) -> torch.Tensor:
    """Protected class of every prefix row: [prefix_len] int64 (``NO_CLASS`` = -1 when none)."""
    table = inputs.require_tokens("protected_classes")
    ids = inputs.prefix_ids
    # Special tokens ("<|im_start|>") look like mixed tokens but are never content.
    case = table.case_of(ids).masked_fill(table.special_mask(ids), 0)
    start = table.word_starts(ids)
    cls = torch.full(ids.shape, NO_CLASS, dtype=torch.int64)
    cls = cls.masked_fill((case == CASE_UPPER) & start, UPPER_START)
    cls = cls.masked_fill((case == CASE_UPPER) & ~start, UPPER_PIECE)
    cls = cls.masked_fill((case == CASE_LOWER) & ~start, LOWER_PIECE)
    return cls.masked_fill(case == CASE_MIXED, MIXED)


def protected_classes(inputs: SelectionInputs, *, share: float) -> torch.Tensor:
    """The rarest `share` of each of four token classes, by add-one unigram frequency (question-blind).

    Classes: uppercase word starts ("Paris"), uppercase word pieces ("Script" in "JavaScript"),
    lowercase word pieces ("ington"), and mixed tokens (letters with digits or symbols, irregular
    case: "x86", "iPhone"). Ordinary lowercase words, digits and punctuation belong to no class. In
    each class the `round(share * class rows)` rows whose token is rarest in the calibration counts
    are taken (ties: earlier row first). Returns ranked rows, rarest first.
    """
    counts = inputs.require_token_counts("protected_classes")
    cls = token_classes(inputs)
    ids = inputs.prefix_ids
    if counts.numel() == 0:
        freq = torch.ones(ids.shape, dtype=torch.float64)
    else:
        seen = counts.index_select(0, ids.clamp(0, counts.numel() - 1)).to(torch.float64)
        freq = seen.masked_fill(ids >= counts.numel(), 0.0) + 1.0
    picked = []
    for c in (UPPER_START, UPPER_PIECE, LOWER_PIECE, MIXED):
        members = rows_where(cls == c)
        k = share_count(share, members.numel())
        if k:
            picked.append(pick(members, rank_ascending(pick(freq, members))[:k]))
    if not picked:
        return empty_rows()
    rows = sorted_rows(torch.cat(picked))
    return pick(rows, rank_ascending(pick(freq, rows)))


def digits(inputs: SelectionInputs) -> torch.Tensor:
    """Prefix rows whose token is made only of digits ("4", " 2027"), in prompt order."""
    table = inputs.require_tokens("digits")
    return rows_where(table.digit_mask(inputs.prefix_ids))


def special_tokens(inputs: SelectionInputs) -> torch.Tensor:
    """Prefix rows holding special tokens (BOS, chat-template markers), in prompt order."""
    table = inputs.require_tokens("special_tokens")
    return rows_where(table.special_mask(inputs.prefix_ids))


PROTECTED_CLASSES = SelectorSpec(
    name="protected_classes",
    fn=protected_classes,
    params=(Param("share", "share", "rarest share of each class", default=0.25),),
    needs_tokens=True,
    needs_token_counts=True,
    expected_rows=lambda args, n: _CLASS_COVERAGE * args["share"] * n,
)
DIGITS = SelectorSpec(
    name="digits", fn=digits, needs_tokens=True, expected_rows=lambda args, n: _TYPICAL_DIGIT_SHARE * n
)
SPECIAL_TOKENS = SelectorSpec(
    name="special_tokens", fn=special_tokens, needs_tokens=True, expected_rows=lambda args, n: 0.0
)
