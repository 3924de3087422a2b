from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.selectors.tokens import CASE_LOWER, CASE_MIXED, CASE_NONE, CASE_UPPER, TokenTable

PIECES = [" The", " cat", "s", " NASA", " x86", "ing", "Script", " 2027", ".", "\n", "iPhone", "<s>", " 猫", "?\""]


def test_case_classes_digits_and_boundaries_by_hand():
    table = TokenTable.from_pieces(PIECES, special_ids=[11])
    assert table.case.tolist() == [
        CASE_UPPER, CASE_LOWER, CASE_LOWER, CASE_UPPER, CASE_MIXED, CASE_LOWER, CASE_UPPER,
        CASE_NONE, CASE_NONE, CASE_NONE, CASE_MIXED, CASE_MIXED, CASE_LOWER, CASE_NONE,
    ]
    assert table.is_digit.tolist() == [i == 7 for i in range(len(PIECES))]
    assert table.ends_sentence.tolist() == [i in (8, 9, 13) for i in range(len(PIECES))]
    assert table.starts_word.tolist() == [p[0].isspace() for p in PIECES]
    assert table.words[3] == "nasa" and table.words[4] == "x86" and table.words[8] == ""
    assert table.special_ids == frozenset({11})


def test_word_starts_follow_context():
    table = TokenTable.from_pieces(PIECES)
    # "<s>" "The"(no marker needed: after '>') " cat" "s" "\n" "Script" "ing"
    ids = torch.tensor([11, 0, 1, 2, 9, 6, 5])
    assert table.word_starts(ids).tolist() == [True, True, True, False, True, True, False]


def test_a_token_opening_with_punctuation_starts_a_word():
    # "forasmuch-kernel" as Qwen's tokenizer splits it (the hyphen opens the next piece) and as SmolLM2's does
    # (the hyphen alone): two words either way, "kernel" starting at the piece after the hyphen.
    table = TokenTable.from_pieces([" for", "asm", "uch", "-k", "ernel", "-", "kernel", ".py"])
    assert table.word_starts(torch.tensor([0, 1, 2, 3, 4])).tolist() == [True, False, False, True, False]
    assert table.word_starts(torch.tensor([0, 1, 2, 5, 6])).tolist() == [True, False, False, True, True]
    assert table.word_starts(torch.tensor([6, 7])).tolist() == [True, True]


def test_ids_outside_the_table_are_neutral():
    table = TokenTable.from_pieces([" a", "7"], special_ids=[0])
    ids = torch.tensor([1, 5, -1])
    assert table.digit_mask(ids).tolist() == [True, False, False]
    assert table.case_of(ids).tolist() == [CASE_NONE, CASE_NONE, CASE_NONE]
    assert table.special_mask(ids).tolist() == [False, False, False]


def test_construction_errors_name_the_problem():
    with pytest.raises(ValueError, match="starts_word has 1 entries but there are 2 pieces"):
        TokenTable(("a", "b"), torch.tensor([True]))
    with pytest.raises(ValueError, match="special id 5 is outside the vocabulary of 2 ids"):
        TokenTable.from_pieces(["a", "b"], special_ids=[5])


class _FakeTokenizer:
    """Duck-typed tokenizer: raw vocabulary strings as a Hugging Face tokenizer reports them."""

    def __init__(self, raw, special):
        self.raw = raw
        self.all_special_ids = special

    def __len__(self):
        return len(self.raw)

    def convert_ids_to_tokens(self, ids):
        return [self.raw[i] for i in ids]

    def decode(self, ids):
        return "".join(self.raw[i] for i in ids)


def test_from_tokenizer_byte_level():
    tok = _FakeTokenizer(["Ġthe", "ĠCat", "s", "Ċ", "The", "<|endoftext|>", "Ã©", "Ġ42"], [5])
    table = TokenTable.from_tokenizer(tok)
    assert table.pieces == (" the", " Cat", "s", "\n", "The", "<|endoftext|>", "é", " 42")
    # A piece that begins with whitespace (the newline included) starts a word.
    assert table.starts_word.tolist() == [True, True, False, True, False, False, False, True]
    assert table.special_ids == frozenset({5})
    assert table.is_digit.tolist()[7] is True


def test_from_tokenizer_sentencepiece():
    tok = _FakeTokenizer(["<unk>", "<s>", "▁The", "▁cat", "s", "<0x0A>", "<0xE2>"], [0, 1])
    table = TokenTable.from_tokenizer(tok)
    assert table.pieces == ("<unk>", "<s>", " The", " cat", "s", "\n", "\ufffd")
    assert table.starts_word.tolist() == [False, False, True, True, False, True, False]
    assert table.ends_sentence.tolist()[5] is True


def test_from_tokenizer_without_markers_uses_decode():
    tok = _FakeTokenizer(["[CLS]", " hello", "##lo"], [0])
    table = TokenTable.from_tokenizer(tok)
    assert table.pieces == ("[CLS]", " hello", "##lo")
    assert table.starts_word.tolist() == [False, True, False]


def test_from_a_real_byte_level_tokenizer(tmp_path):
    pytest.importorskip("tokenizers")
    from tests.support.models import make_tokenizer

    tok = make_tokenizer(tmp_path, vocab_size=400)
    table = TokenTable.from_tokenizer(tok)
    assert len(table) == len(tok)
    ids = tok("The year 2027 was\nfine.")["input_ids"]
    # Oracle: the tokenizer's own per-token decoding, not the table.
    expected = [tok.decode([i]).strip().isdigit() and tok.decode([i]).strip() != "" for i in ids]
    assert table.digit_mask(torch.tensor(ids)).tolist() == expected
    assert any(expected)
    for i in ids:
        assert table.pieces[i] == tok.decode([i])
