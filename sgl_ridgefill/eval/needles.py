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

import collections
import dataclasses
import math
import random
import string
from typing import Any, Iterable, Sequence

from .haystack import NOISE, Haystack, StreamCache, open_haystack, sample_words

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe")
REGIONS = ("filled", "straddle", "tail")
# RULER generates 128 tokens for niah and 120 for cwe; these fit the answers with room to spare.
MAX_NEW_TOKENS = {"niah_single": 32, "niah_multikey": 32, "niah_multivalue": 64, "niah_multiquery": 64, "vt": 32, "cwe": 120}

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
_CWE_HEAD = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n"
_CWE_QUESTION = "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are:"
_SEP = "\n"  # each needle stands on its own line
_MANY = 4  # keys (multikey, multiquery) or values (multivalue), as in RULER's configurations
_VT_HOPS = 4
_GAP = (16, 64)  # haystack tokens between consecutive relevant needles, before shrinking to fit a region
_CWE_COMMON = 10


@dataclasses.dataclass(frozen=True)
class NeedleSample:
    """One prompt with its references and where the needles are.

    ``needle_spans``: ``[start, end)`` token spans of the needles the answer depends on, in prompt order
    (for cwe: every occurrence of a common word). ``depth``: the first span's start over ``length``.
    ``region``: ``"filled"`` if every span ends by ``length - tail``, ``"tail"`` if every span starts at or
    after it, else ``"straddle"`` (for cwe, whose spans are every occurrence of a common word, usually
    ``"straddle"``). ``question_len``: the question's tokens at the end of ``input_ids`` (0: not recorded);
    ``other_questions``: token ids of questions about the document's other needles (niah_multikey: one per
    distractor key), asked before this sample's own in the later-question arms.
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


@dataclasses.dataclass(frozen=True)
class _Content:
    """What a needle task says, before tokenization; ``relevant`` needles in placement order."""

    header: str
    question: str
    relevant: tuple[str, ...]
    distractors: tuple[str, ...]
    answers: tuple[str, ...]
    other_questions: tuple[str, ...] = ()  # about the distractors' keys


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
        return _build_cwe(tokenizer, length, tail, hay, seed, depth_index)
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
                    samples.append(_build_cwe(tokenizer, length, tail, words_from, seed, 0))
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
    head = bos_prefix(tok) + _encode(tok, content.header)
    question = _encode(tok, content.question)
    sep = tuple(_encode(tok, _SEP))
    relevant = [tuple(_encode(tok, t)) for t in content.relevant]
    distractors = [tuple(_encode(tok, t)) for t in content.distractors]
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
    sample = _sample(sample_id, task, hay.name, length, tail, ids, content.answers, spans)
    others = tuple(tuple(_encode(tok, q)) for q in content.other_questions)
    return dataclasses.replace(sample, question_len=len(question), other_questions=others)


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
    return _Content(header, question.format(query=query), tuple(relevant), tuple(distractors), answers, others)


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


def _build_cwe(tok: Any, length: int, tail: int, hay: Haystack, seed: int, depth_index: int) -> NeedleSample:
    """RULER's common words extraction: RULER repeats the ten common words 30 times and the others 3
    times from 4096 tokens on, 6 and 1 below (with a smaller example). The common repeat is lowered for
    short prompts so that common words take at most half the list; the list is then sized to the token
    budget and ends with once-only words chosen to make the length exact."""
    sample_id = f"cwe/words/{length}/{depth_index}/{seed}"
    rng = random.Random(sample_id)
    common_repeat, rare_repeat, example_shape = (30, 3, (40, 10, 3)) if length >= 4096 else (6, 1, (20, 3, 1))
    pool = sample_words(hay.words, len(hay.words), rng, what="cwe")  # the whole word list, shuffled
    example_words, pool = pool[: example_shape[0]], pool[example_shape[0]:]
    if len(pool) <= _CWE_COMMON:
        raise ValueError(f"cwe: the {hay.name!r} word list ({len(hay.words)} words) is too small")
    head = bos_prefix(tok) + _encode(tok, _cwe_example(rng, example_words, *example_shape[1:]) + "\n" + _CWE_HEAD)
    question = _encode(tok, _CWE_QUESTION)
    budget = length - len(head) - len(question)
    common, rare = pool[:_CWE_COMMON], pool[_CWE_COMMON:]
    avg = sum(_item_lengths(tok, rare[:64], max(1, budget // 8))) / len(rare[:64])
    common_repeat = min(common_repeat, int(budget / avg) // (2 * _CWE_COMMON))
    if budget <= 0 or common_repeat <= rare_repeat:
        raise ValueError(f"length {length} is too small for 'cwe': the template takes {len(head) + len(question)} tokens "
                         f"and the list needs room for the ten common words to recur")
    cap = len(rare) - 128  # keep some words for the exact fill
    slack = max(16, min(budget // 200, 128))
    n_rare = max(0, math.ceil((budget / avg - _CWE_COMMON * common_repeat) / rare_repeat))
    for attempt in range(64):
        n_rare = min(max(n_rare, 0), max(cap, 0))
        seq = common * common_repeat + rare[:n_rare] * rare_repeat
        rng.shuffle(seq)
        lens = _item_lengths(tok, seq, 1)
        room = budget - sum(lens)
        per_word = rare_repeat * sum(lens) / len(seq)
        if room < 0:
            if n_rare == 0:
                raise ValueError(f"length {length} is too small for 'cwe' with {common_repeat} repeats of each common word")
            n_rare -= max(1, math.ceil(-room / per_word))
        elif room > slack and n_rare >= cap:
            raise ValueError(f"cwe at length {length} needs more distinct words than the {hay.name!r} word list has "
                             f"({len(hay.words)}); use the 'text' haystack or a larger folder")
        elif room > slack and attempt < 8:
            n_rare += max(1, int(room / per_word))
        else:
            break
    seq, lens = _fill_exact(tok, seq, lens, budget, set(common), rare[n_rare:])
    spans, at = [], len(head)
    for word, size in zip(seq, lens):
        if word in common:
            spans.append((at, at + size))
        at += size
    ids = head + [t for ids_ in _encode_items(tok, seq, 1) for t in ids_] + question
    counts = collections.Counter(seq)
    assert min(counts[w] for w in common) > max((c for w, c in counts.items() if w not in common), default=0), "cwe: common words must recur most"
    # The word list spans the whole context, so a cwe sample is usually "straddle": the tail alone holds
    # enough occurrences to answer, and it must not count as filled-region retrieval.
    return _sample(sample_id, "cwe", "words", length, tail, ids, tuple(common), spans)


def _cwe_example(rng: random.Random, words: Sequence[str], common_repeat: int, rare_repeat: int) -> str:
    common = list(words[:_CWE_COMMON])
    seq = common * common_repeat + list(words[_CWE_COMMON:]) * rare_repeat
    rng.shuffle(seq)
    return _CWE_HEAD + _numbered(seq) + _CWE_QUESTION + " " + _numbered(common)


def _fill_exact(tok: Any, seq: list[str], lens: list[int], budget: int, common: set[str], spare: list[str]) -> tuple[list[str], list[int]]:
    """Append once-only words from ``spare`` so the item tokens sum to ``budget`` exactly.

    The last few tokens are solved exactly over single words and two- and three-word compounds
    ("goalhouse"): with a large vocabulary every common word is one token and every item the same size,
    and compounds bring the other sizes. When nothing fits the room left, the last non-common item is dropped (renumbering
    the items after it) and the search runs again.
    """
    seq, lens = list(seq), list(lens)
    for _ in range(32):
        room, index, extra = budget - sum(lens), len(seq) + 1, []
        words = iter(spare)
        biggest = max(_sizes_at(tok, spare[:48], index), default=0)
        while room > 3 * biggest:  # a long run: any word fits
            word = next(words, None)
            if word is None:
                raise ValueError(f"cwe: ran out of spare words to fill {room} tokens")
            size = _item_lengths(tok, [word], index)[0]
            if size <= room - biggest:
                extra.append(word)
                room -= size
                index += 1
        left = [w for w in spare if w not in set(extra)][:48]
        if len(left) < 3:
            raise ValueError(f"cwe: ran out of spare words to fill {room} tokens")
        pairs = [a + b for a, b in zip(left, left[1:] + left[:1])]
        triples = [a + b + c for a, b, c in zip(left[:16], left[16:32], left[32:48])]
        candidates = list(dict.fromkeys(left[:16] + pairs + triples))
        last = _exact_items(tok, room, index, candidates, depth=8, failed=set())
        if last is not None:
            extra += last
            return seq + extra, lens + _item_lengths(tok, extra, len(seq) + 1)
        drop = next((i for i in range(len(seq) - 1, -1, -1) if seq[i] not in common), None)
        if drop is None:
            break
        del seq[drop], lens[drop]
        lens[drop:] = _item_lengths(tok, seq[drop:], drop + 1)
    raise ValueError(f"cwe: cannot make the word list exactly {budget} tokens long")


def _exact_items(tok: Any, room: int, index: int, candidates: list[str], depth: int,
                 failed: set[tuple[int, int]]) -> list[str] | None:
    """Words whose items, numbered from ``index``, take exactly ``room`` tokens: depth-first over one
    candidate per distinct item length, at most ``depth`` words; ``failed`` remembers dead ``(room, index)``."""
    if room == 0:
        return []
    if depth == 0 or not candidates or (room, index) in failed:
        return None
    tried: set[int] = set()
    for word, size in zip(candidates, _sizes_at(tok, candidates, index)):
        if size > room or size in tried:
            continue
        tried.add(size)
        rest = _exact_items(tok, room - size, index + 1, [w for w in candidates if w != word], depth - 1, failed)
        if rest is not None:
            return [word] + rest
    failed.add((room, index))
    return None


def _numbered(words: Sequence[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _encode_items(tok: Any, words: Sequence[str], first: int) -> list[list[int]]:
    """Token ids of each list item ``"{n}. {word}"``, numbered from ``first``, each tokenized alone
    (items after the first carry the separating space)."""
    if not words:
        return []
    texts = [f"{'' if n == 1 else ' '}{n}. {w}" for n, w in enumerate(words, start=first)]
    return [list(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


def _item_lengths(tok: Any, words: Sequence[str], first: int) -> list[int]:
    return [len(ids) for ids in _encode_items(tok, words, first)]


def _sizes_at(tok: Any, words: Sequence[str], index: int) -> list[int]:
    """Token counts of item number ``index`` holding each of ``words`` in turn."""
    if not words:
        return []
    texts = [f"{'' if index == 1 else ' '}{index}. {w}" for w in words]
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


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


def _sample(sample_id: str, task: str, haystack: str, length: int, tail: int, ids: list[int],
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


def _distinct(rng: random.Random, count: int, draw) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        value = draw()
        if value not in out:
            out.append(value)
    return out


def bos_prefix(tok: Any) -> list[int]:
    """``[bos]`` when the tokenizer has one and adds it by itself, else ``[]``."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return []
    ids = tok("a")["input_ids"]
    return [bos] if ids and ids[0] == bos else []


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown needle task {task!r}; expected one of {TASKS}")


def _check_sizes(length: int, tail: int) -> None:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be a positive integer, got {length!r}")
    if isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail < length:
        raise ValueError(f"tail must be an integer in [0, length={length}), got {tail!r}")
