"""RULER-style needle tasks, built token-exactly and labelled by where the needles sit against the tail.

RidgeFill approximates the KV cache of a prompt's first ``length - tail`` tokens (the *filled* prefix)
and runs the full model on the last ``tail`` tokens. A retrieval score says something about the fill
only for samples whose needles lie in the filled prefix, so every sample records its needles' exact
token spans and a region label: ``"filled"``, ``"tail"`` or ``"straddle"``.

The prompts follow RULER (NVIDIA/RULER ``scripts/data/synthetic``) in base-model completion style: the
task template, then the answer prefix, with nothing after it. Six tasks:

- ``niah_single``: one ``One of the special magic numbers for {key} is: {value}.`` needle (7-digit value);
- ``niah_multikey``: the same plus three needles for other keys (distractors, not in ``needle_spans``;
  the later-question arms ask about them first, on the same cached document);
- ``niah_multivalue``: four needles for one key, all four values asked for;
- ``niah_multiquery``: four keys with one value each, all four asked for;
- ``vt``: variable tracking, one chain ``VAR A = 12345``, ``VAR B = VAR A``, ... (1 + 4 hops), after
  RULER's one-shot example; the answer is every variable in the chain;
- ``cwe``: common words extraction, a numbered word list in which ten words recur; after RULER's
  one-shot example; the answer is those ten words.

Exactness: the prompt is a concatenation of separately tokenized pieces (header, haystack tokens, each
needle between newline pieces, question with answer prefix); haystack tokens are cut so that the prompt
has exactly ``length`` tokens and the first relevant needle's first token sits exactly at ``position``.
Other relevant needles (multivalue, multiquery, the vt chain) follow within a few hundred tokens, with
the gaps shrunk so the block stays in the first needle's region when it can. Keys, values and gaps come
from a ``random.Random`` seeded with the sample id, so a sample is reproducible from its id alone.
"""

from __future__ import annotations

import dataclasses
import random
import string
from typing import Any, Iterable, Sequence

from .cwe import build_cwe
from .haystack import NOISE, Haystack, StreamCache, open_haystack, sample_words
from .needle_sample import MAX_NEW_TOKENS, REGIONS, TASKS, NeedleSample, bos_prefix, encode, labelled_sample  # noqa: F401 - the needles' API

_NEEDLE = "One of the special magic numbers for {key} is: {value}."
# RULER's niah template; with one answer its plural words are made singular (niah.py does the same).
_NIAH_ONE = (
    "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about the number afterwards.\n",
    "\nWhat is the special magic number for {query} mentioned in the provided text? The special magic number for {query} mentioned in the provided text is",
)
_NIAH_ALL = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz you about the numbers afterwards.\n",
    "\nWhat are all the special magic numbers for {query} mentioned in the provided text? The special magic numbers for {query} mentioned in the provided text are",
)
_VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
_VT_QUESTION = (
    "\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: According to the "
    "chain(s) of variable assignment in the text above, {count} variables are assigned the value {value}, they are: "
)
_SEP = "\n"  # each needle stands on its own line
_MANY = 4  # keys (multikey, multiquery) or values (multivalue), as in RULER's configurations
_VT_HOPS = 4
_GAP = (16, 64)  # haystack tokens between consecutive relevant needles, before shrinking to fit a region


@dataclasses.dataclass(frozen=True)
class _Content:
    """What a needle task says, before tokenization; ``relevant`` needles in placement order."""

    header: str
    question: str
    relevant: tuple[str, ...]
    distractors: tuple[str, ...]
    answers: tuple[str, ...]
    other_questions: tuple[str, ...] = ()  # about the distractors' keys
    distractor_answers: tuple[str, ...] = ()  # the distractors' values


@dataclasses.dataclass(frozen=True)
class _Insert:
    start: int  # prompt index of the insert's first token (the separator before the needle)
    needle: tuple[int, ...]
    sep: tuple[int, ...]
    relevant: bool

    @property
    def size(self) -> int:
        return len(self.needle) + 2 * len(self.sep)


def depth_grid(length: int, tail: int, n_filled: int = 5) -> tuple[int, ...]:
    """Needle positions (token indices) for a prompt of ``length`` tokens with an exact tail of ``tail``.

    ``n_filled`` positions evenly spread over ``[5%, 95%)`` of the filled prefix ``length - tail``, then
    four around the boundary: 256 and 32 tokens before it (filled), 32 after it and the middle of the tail
    (tail). Positions are clamped to ``[0, length)`` and repeats dropped; :func:`make_samples` further
    clamps each to where the task's needles fit.
    """
    _check_sizes(length, tail)
    if isinstance(n_filled, bool) or not isinstance(n_filled, int) or n_filled < 0:
        raise ValueError(f"n_filled must be a non-negative integer, got {n_filled!r}")
    boundary = length - tail
    filled = [int((0.05 + 0.9 * i / n_filled) * boundary) for i in range(n_filled)]
    edge = [boundary - 256, boundary - 32, boundary + 32, boundary + tail // 2]
    out: list[int] = []
    for p in filled + edge:
        p = min(max(p, 0), length - 1)
        if p not in out:
            out.append(p)
    return tuple(out)


def make_sample(
    tokenizer: Any, task: str, length: int, tail: int, position: int, *, haystack: str = "noise",
    seed: int = 0, depth_index: int = 0, exclude_ids: Iterable[str] = frozenset(),
) -> NeedleSample:
    """One sample of exactly ``length`` tokens whose first relevant needle starts at token ``position``.

    ``haystack``: ``"noise"``, ``"text"`` or a folder (see :mod:`.haystack`); for cwe it only chooses where
    the words come from (the sample's haystack is ``"words"``) and ``position`` is ignored. Raises
    ``ValueError`` for an unknown task or haystack, a ``length`` too small for the template and needles, or a
    ``position`` where the needles do not fit.
    """
    _check_task(task)
    _check_sizes(length, tail)
    hay = open_haystack(haystack)
    if task == "cwe":
        return build_cwe(tokenizer, length, tail, hay, seed, depth_index)
    return _build_niah(tokenizer, task, length, tail, position, hay, seed, depth_index, exclude_ids,
                       StreamCache(tokenizer), clamp=False)


def make_samples(
    tokenizer: Any, tasks: Sequence[str], lengths: Sequence[int], tail: int, *,
    haystacks: Sequence[str] = ("noise", "text"), seeds: Sequence[int] = (0,), n_filled: int = 5,
    exclude_ids: Iterable[str] = frozenset(),
) -> list[NeedleSample]:
    """Every task x haystack x length x seed x :func:`depth_grid` position.

    Grid positions are clamped to where the task's needles fit; a position that clamps onto one already
    made is skipped (so ``depth_index`` values can have gaps). cwe makes one sample per length and seed,
    with words from the first haystack that is not ``"noise"`` (falling back to noise's built-in list).
    """
    if not haystacks:
        raise ValueError("make_samples: haystacks is empty; give at least one of 'noise', 'text' or a folder")
    for task in tasks:
        _check_task(task)
    exclude_ids = frozenset(exclude_ids)
    opened = [open_haystack(h) for h in haystacks]
    streams = StreamCache(tokenizer, min_tokens=max(lengths, default=0))
    samples: list[NeedleSample] = []
    for task in tasks:
        for length in lengths:
            grid = depth_grid(length, tail, n_filled)
            for seed in seeds:
                if task == "cwe":
                    words_from = next((h for h in opened if not h.is_noise), opened[0])
                    samples.append(build_cwe(tokenizer, length, tail, words_from, seed, 0))
                    continue
                for hay in opened:
                    seen: set[int] = set()
                    for index, position in enumerate(grid):
                        sample = _build_niah(tokenizer, task, length, tail, position, hay, seed, index, exclude_ids, streams, clamp=True)
                        first = sample.needle_spans[0][0]
                        if first not in seen:
                            seen.add(first)
                            samples.append(sample)
    return samples


def string_match_all(prediction: str, answers: Iterable[str]) -> float:
    """RULER's ``string_match_all`` for one prediction: 100 x the share of references found in it,
    case-insensitively."""
    refs = tuple(answers)
    if not refs:
        raise ValueError("string_match_all: answers is empty")
    pred = prediction.lower()
    return 100.0 * sum(ref.lower() in pred for ref in refs) / len(refs)


def _build_niah(tok: Any, task: str, length: int, tail: int, position: int, hay: Haystack, seed: int,
                depth_index: int, exclude_ids: Iterable[str], streams: StreamCache, *, clamp: bool) -> NeedleSample:
    sample_id = f"{task}/{hay.name}/{length}/{depth_index}/{seed}"
    rng = random.Random(sample_id)
    content = _vt(rng) if task == "vt" else _niah(task, rng, hay.words)
    head = bos_prefix(tok) + encode(tok, content.header)
    question = encode(tok, content.question)
    sep = tuple(encode(tok, _SEP))
    relevant = [tuple(encode(tok, t)) for t in content.relevant]
    distractors = [tuple(encode(tok, t)) for t in content.distractors]
    ctx_start, ctx_end = len(head), length - len(question)
    block = sum(len(n) + 2 * len(sep) for n in relevant)
    needles = block + sum(len(n) + 2 * len(sep) for n in distractors)
    if ctx_end - ctx_start < needles:
        raise ValueError(f"length {length} is too small for {task!r}: the template takes {len(head) + len(question)} "
                         f"tokens and the needles {needles}")
    lo, hi = ctx_start + len(sep), ctx_end - block + len(sep)
    if not lo <= position <= hi:
        if not clamp:
            raise ValueError(f"position {position} is out of range for {task!r} at length {length}: "
                             f"the first needle can start at {lo}..{hi}")
        position = min(max(position, lo), hi)

    # Gaps between relevant needles, shrunk so the block ends in the region where it starts.
    gaps = [rng.randint(*_GAP) for _ in relevant[1:]]
    boundary = length - tail
    region_end = min(boundary if position < boundary else ctx_end, ctx_end)
    room = max(region_end - (position - len(sep)) - block, 0)
    if gaps and sum(gaps) > room:
        gaps = [room // len(gaps)] * len(gaps)
    inserts, start = [], position - len(sep)
    for i, needle in enumerate(relevant):
        start += gaps[i - 1] if i else 0
        inserts.append(_Insert(start, needle, sep, True))
        start += inserts[-1].size
    for needle in distractors:
        size = len(needle) + 2 * len(sep)
        taken = [(x.start, x.start + x.size) for x in inserts]
        inserts.append(_Insert(_free_start(rng, size, ctx_start, ctx_end, taken, length, task), needle, sep, False))

    stream = streams.take(hay, length, seed, exclude_ids)
    ids, spans = _assemble(head, question, length, inserts, stream)
    sample = labelled_sample(sample_id, task, hay.name, length, tail, ids, content.answers, spans)
    others = tuple(tuple(encode(tok, q)) for q in content.other_questions)
    return dataclasses.replace(sample, question_len=len(question), other_questions=others,
                               distractor_answers=content.distractor_answers)


def _niah(task: str, rng: random.Random, words: tuple[str, ...]) -> _Content:
    n_keys = _MANY if task in ("niah_multikey", "niah_multiquery") else 1
    n_values = _MANY if task == "niah_multivalue" else 1
    picked = sample_words(words, 2 * n_keys, rng, what=f"{task} keys")
    keys = [f"{a}-{b}" for a, b in zip(picked[::2], picked[1::2])]  # RULER's keys are adjective-noun pairs
    numbers = _distinct(rng, n_keys * n_values, lambda: str(rng.randint(10**6, 10**7 - 1)))
    values = [numbers[i * n_values:(i + 1) * n_values] for i in range(n_keys)]
    queried = n_keys if task == "niah_multiquery" else 1
    relevant = [_NEEDLE.format(key=k, value=v) for k, vs in zip(keys[:queried], values) for v in vs]
    distractors = [_NEEDLE.format(key=k, value=v) for k, vs in zip(keys[queried:], values[queried:]) for v in vs]
    rng.shuffle(relevant)
    answers = tuple(v for vs in values[:queried] for v in vs)
    query = keys[0] if queried == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]
    header, question = _NIAH_ONE if len(answers) == 1 else _NIAH_ALL
    others = tuple(_NIAH_ONE[1].format(query=k) for k in keys[queried:]) if task == "niah_multikey" else ()
    return _Content(header, question.format(query=query), tuple(relevant), tuple(distractors), answers, others,
                    tuple(v for vs in values[queried:] for v in vs))


def _vt(rng: random.Random) -> _Content:
    """RULER's variable tracking (noise one-shot example with 3-letter names, then the task)."""
    count = _VT_HOPS + 1  # variables in the chain
    names = _distinct(rng, count, lambda: "".join(rng.choices(string.ascii_uppercase, k=5)))
    example_names = _distinct(rng, count, lambda: "".join(rng.choices(string.ascii_uppercase, k=3)))
    example_value, value = _distinct(rng, 2, lambda: str(rng.randint(10000, 99999)))
    example_lines = [line for stmt in _chain(example_names, example_value) for line in (NOISE, stmt)]
    example = (_VT_HEAD + "\n".join(example_lines) + _VT_QUESTION.format(value=example_value, count=count)
               + " ".join(example_names) + "\n\n")
    return _Content(example + _VT_HEAD, _VT_QUESTION.format(value=value, count=count), tuple(_chain(names, value)), (), tuple(names))


def _chain(names: Sequence[str], value: str) -> list[str]:
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]


def _free_start(rng: random.Random, size: int, lo: int, hi: int, taken: list[tuple[int, int]], length: int, task: str) -> int:
    """A uniformly drawn start ``s`` with ``[s, s + size)`` inside ``[lo, hi)`` and clear of ``taken``."""
    fits, cursor = [], lo
    for a, b in sorted(taken) + [(hi, hi)]:
        if a - cursor >= size:
            fits.append((cursor, a - size))
        cursor = max(cursor, b)
    if not fits:
        raise ValueError(f"length {length} is too small for {task!r}: no room left for a distractor needle")
    k = rng.randrange(sum(b - a + 1 for a, b in fits))
    for a, b in fits:
        if k <= b - a:
            return a + k
        k -= b - a + 1
    raise AssertionError("unreachable")


def _assemble(head: list[int], question: list[int], length: int, inserts: list[_Insert],
              stream: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """``head``, haystack tokens with ``inserts`` at their starts, ``question``: exactly ``length`` ids."""
    ids, spans, used = list(head), [], 0
    for insert in sorted(inserts, key=lambda x: x.start):
        take = insert.start - len(ids)
        assert take >= 0, "needle inserts overlap"
        ids += stream[used:used + take]
        used += take
        ids += insert.sep
        if insert.relevant:
            spans.append((len(ids), len(ids) + len(insert.needle)))
        ids += insert.needle
        ids += insert.sep
    ids += stream[used:used + length - len(question) - len(ids)]
    ids += question
    assert len(ids) == length, f"assembled {len(ids)} tokens for length {length}"
    return ids, spans


def _distinct(rng: random.Random, count: int, draw) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        value = draw()
        if value not in out:
            out.append(value)
    return out


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown needle task {task!r}; expected one of {TASKS}")


def _check_sizes(length: int, tail: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive integer, got {length!r}")
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail < length:
        raise ValueError(f"tail must be an integer in [0, length={length}), got {tail!r}")
