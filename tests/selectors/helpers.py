"""Small hand-made vocabularies and inputs shared by the selector tests."""

from __future__ import annotations

import torch

from sgl_ridgefill.selectors.base import SelectionInputs
from sgl_ridgefill.selectors.tokens import TokenTable


def table_and_ids(words: list[str], specials: tuple[str, ...] = ()) -> tuple[TokenTable, list[int]]:
    """A vocabulary holding each distinct piece of ``words`` (first-seen order) and the prompt's ids."""
    vocab: dict[str, int] = {}
    for w in list(specials) + words:
        vocab.setdefault(w, len(vocab))
    table = TokenTable.from_pieces(list(vocab), special_ids=[vocab[s] for s in specials])
    return table, [vocab[w] for w in words]


def inputs(ids, prefix_len: int, **kw) -> SelectionInputs:
    return SelectionInputs(token_ids=torch.tensor(ids, dtype=torch.int64), prefix_len=prefix_len, **kw)
