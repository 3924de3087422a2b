"""A needle sample: one prompt, its answers, where its needles sit and the region that makes them count.

The task builders (``needles.py``, ``cwe.py``) assemble a prompt token by token and hand it here with the
needles' token spans; :func:`labelled_sample` labels it ``"filled"``, ``"tail"`` or ``"straddle"`` against the tail.
"""

from __future__ import annotations

import dataclasses
from typing import Any

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe")
REGIONS = ("filled", "straddle", "tail")
# RULER generates 128 tokens for niah and 120 for cwe; these fit the answers with room to spare.
MAX_NEW_TOKENS = {"niah_single": 32, "niah_multikey": 32, "niah_multivalue": 64, "niah_multiquery": 64, "vt": 32, "cwe": 120}


@dataclasses.dataclass(frozen=True)
class NeedleSample:
    """One prompt with its references and where the needles are.

    ``needle_spans``: ``[start, end)`` token spans of the needles the answer depends on, in prompt order
    (for cwe: every occurrence of a common word). ``depth``: the first span's start over ``length``.
    ``region``: ``"filled"`` if every span ends by ``length - tail``, ``"tail"`` if every span starts at or
    after it, else ``"straddle"`` (for cwe, whose spans are every occurrence of a common word, usually
    ``"straddle"``). ``question_len``: the question's tokens at the end of ``input_ids`` (0: not recorded);
    ``other_questions``: token ids of questions about the document's other needles (niah_multikey: one per
    distractor key), asked before this sample's own in the later-question arms; ``distractor_answers``: the
    values of those other keys' needles (a wrong answer that gives one found the wrong needle).
    """

    id: str
    task: str
    haystack: str
    length: int
    input_ids: tuple[int, ...]
    answers: tuple[str, ...]
    needle_spans: tuple[tuple[int, int], ...]
    depth: float
    region: str
    max_new_tokens: int
    question_len: int = 0
    other_questions: tuple[tuple[int, ...], ...] = ()
    distractor_answers: tuple[str, ...] = ()

    def other_prompt(self, i: int) -> tuple[int, ...]:
        """The document of this sample followed by its ``i``-th other question."""
        return self.input_ids[: self.length - self.question_len] + self.other_questions[i]

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"NeedleSample {self.id!r}: unknown task {self.task!r}; expected one of {TASKS}")
        if len(self.input_ids) != self.length:
            raise ValueError(f"NeedleSample {self.id!r}: {len(self.input_ids)} input ids but length {self.length}")
        if self.region not in REGIONS:
            raise ValueError(f"NeedleSample {self.id!r}: region {self.region!r} is not one of {REGIONS}")
        if not self.needle_spans or any(not 0 <= a < b <= self.length for a, b in self.needle_spans):
            raise ValueError(f"NeedleSample {self.id!r}: needle spans {self.needle_spans} do not fit length {self.length}")


def labelled_sample(sample_id: str, task: str, haystack: str, length: int, tail: int, ids: list[int],
            answers: tuple[str, ...], spans: list[tuple[int, int]]) -> NeedleSample:
    boundary = length - tail
    if all(b <= boundary for _, b in spans):
        region = "filled"
    elif all(a >= boundary for a, _ in spans):
        region = "tail"
    else:
        region = "straddle"
    return NeedleSample(sample_id, task, haystack, length, tuple(ids), answers, tuple(spans),
                        spans[0][0] / length, region, MAX_NEW_TOKENS[task])


def bos_prefix(tok: Any) -> list[int]:
    """``[bos]`` when the tokenizer has one and adds it by itself, else ``[]``."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return []
    ids = tok("a")["input_ids"]
    return [bos] if ids and ids[0] == bos else []


def encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])
