"""RULER's common words extraction (``cwe``), built token-exactly: a numbered word list in which ten words
recur, after RULER's one-shot example; the answer is those ten words."""

from __future__ import annotations

import collections
import math
import random
from typing import Any, Sequence

from .haystack import Haystack, sample_words
from .needle_sample import NeedleSample, bos_prefix, encode, labelled_sample

_CWE_HEAD = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n"
_CWE_QUESTION = "\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are:"
_CWE_COMMON = 10


def build_cwe(tok: Any, length: int, tail: int, hay: Haystack, seed: int, depth_index: int) -> NeedleSample:
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
    head = bos_prefix(tok) + encode(tok, _cwe_example(rng, example_words, *example_shape[1:]) + "\n" + _CWE_HEAD)
    question = encode(tok, _CWE_QUESTION)
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
    return labelled_sample(sample_id, "cwe", "words", length, tail, ids, tuple(common), spans)


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
