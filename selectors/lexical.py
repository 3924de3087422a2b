"""``lexical_net``: sentences that talk about what the end of the prompt asks about, and hold a rare word.

Attention from the question misses a sentence the question paraphrases; shared vocabulary with the last
content tokens plus a word too rare to be boilerplate catches many of those (the Qwen3.8-27B deployment
reserves up to 5 % of its budget for these rows).
"""

from __future__ import annotations

from collections import Counter

import torch

from .base import SelectionInputs
from .rows import empty_rows, pick, rank_by_score
from .spec import Param, SelectorSpec

# Function words never count as shared or rare: with them nearly every sentence shares four words
# ("the", "of", "and", "that") with any question.
STOPWORDS = frozenset(
    """
    about above after again against all also and any are because been before being below between both but
    can could did does doing down during each few for from further had has have having her here hers herself
    him himself his how into its itself just more most not now off once only other our ours ourselves out
    over own same she should some such than that the their theirs them themselves then there these they this
    those through too under until very was were what when where which while who whom why will with would you
    your yours yourself yourselves
    """.split()
)
_MIN_WORD_LEN = 3
# Assumed for `policy explain` only: the net is normally capped by its reservation.
_TYPICAL_SHARE = 0.05


def _is_lexical(word: str, stopwords: bool) -> bool:
    return len(word) >= _MIN_WORD_LEN and not (stopwords and word in STOPWORDS)


def _segment_words(texts: list[str], alnum: list[bool], starts: list[bool]) -> tuple[list[str], list[int], list[int]]:
    """Words of a prompt of ``n`` tokens: maximal runs of alphanumeric tokens, split at word starts.

    texts, alnum, starts: per position, the token's word text, whether it is alphanumeric (and not
    special), whether it starts a word. Returns ``(words, first, word_at)``: each word's text, the position
    of its first token, and per position the index of the word holding it (-1 outside words). Each word's
    pieces are joined once, so one unbroken run (a base64 blob) costs time linear in its length.
    """
    pieces: list[list[str]] = []
    first: list[int] = []
    word_at = [-1] * len(texts)
    current = -1
    for i, text in enumerate(texts):
        if not alnum[i]:
            current = -1
            continue
        if starts[i] or current < 0:
            pieces.append([text])
            first.append(i)
            current = len(pieces) - 1
        else:
            pieces[current].append(text)
        word_at[i] = current
    return ["".join(p) for p in pieces], first, word_at


def lexical_net(
    inputs: SelectionInputs,
    *,
    min_shared: int,
    query_tokens: int,
    max_count: int,
    rows_per_sentence: int,
    stopwords: bool,
) -> torch.Tensor:
    """Sentences sharing `min_shared` or more words with the last `query_tokens` content tokens of the
    prompt and holding a word that appears at most `max_count` times in the prefix (first
    `rows_per_sentence` rows of each).

    Words are maximal runs of alphanumeric tokens split at word starts (a word-start marker, or punctuation
    before or opening the token: ``TokenTable.word_starts``, so ``forasmuch-kernel`` is two words whichever side
    of the hyphen the tokenizer put it), compared lowercase; words shorter than three characters, and function
    words when `stopwords` is true, are ignored. A sentence ends after a token ending in ".", "!" or "?"
    (closing quotes allowed), a token holding a newline, or a special token. Content tokens are non-special
    tokens with a letter or digit; sentences that reach into those last content tokens are skipped (they would
    match themselves).
    Returns ranked rows: sentences sharing more words first, then prompt order.
    """
    table = inputs.require_tokens("lexical_net")
    prefix_len = inputs.prefix_len
    ids = inputs.token_ids
    if prefix_len == 0 or ids.numel() == 0:
        return empty_rows()
    inside = ids < len(table)
    safe = ids.clamp(0, len(table) - 1)
    special = table.special_mask(ids)
    alnum = (table.has_alnum.index_select(0, safe) & inside & ~special).tolist()
    breaks = ((table.ends_sentence.index_select(0, safe) & inside) | special).tolist()
    starts = table.word_starts(ids).tolist()
    texts = [table.words[i] for i in safe.tolist()]

    words, word_first, word_at = _segment_words(texts, alnum, starts)

    content = [i for i, a in enumerate(alnum) if a]
    window = content[-query_tokens:]
    if not window:
        return empty_rows()
    lexical = [_is_lexical(w, stopwords) for w in words]
    question = {words[word_at[i]] for i in window if lexical[word_at[i]]}
    window_start = window[0]
    counts = Counter(w for w, first in zip(words, word_first) if first < prefix_len)

    # Sentences [start, stop) in order; words are in order of their first position, so one cursor
    # walks both.
    limit = min(prefix_len, window_start)
    bounds = []
    start = 0
    for i in range(limit):
        if breaks[i]:
            bounds.append((start, i + 1))
            start = i + 1
    # The prefix's last sentence may run on into the tail (kept, clipped) but not into the question.
    if start < limit and window_start >= prefix_len:
        bounds.append((start, limit))

    rows: list[int] = []
    scores: list[float] = []
    w = 0
    for start, stop in bounds:
        while w < len(words) and word_first[w] < start:
            w += 1
        sentence = set()
        while w < len(words) and word_first[w] < stop:
            if lexical[w]:
                sentence.add(words[w])
            w += 1
        shared = len(sentence & question)
        if shared >= min_shared and any(counts[x] <= max_count for x in sentence):
            picked = range(start, min(stop, start + rows_per_sentence))
            rows.extend(picked)
            scores.extend([float(shared)] * len(picked))
    if not rows:
        return empty_rows()
    return pick(torch.tensor(rows, dtype=torch.int64), rank_by_score(torch.tensor(scores)))


SPEC = SelectorSpec(
    name="lexical_net",
    fn=lexical_net,
    params=(
        Param("min_shared", "int", "words a sentence must share with the question", default=4, minimum=1, maximum=1000),
        Param("query_tokens", "int", "last content tokens that form the question", default=64, minimum=1, maximum=1 << 20),
        Param("max_count", "int", "prefix occurrences at which a word still counts as rare", default=2, minimum=1, maximum=1 << 20),
        Param("rows_per_sentence", "int", "rows taken from the start of each nominated sentence", default=80, minimum=1, maximum=1 << 20),
        Param("stopwords", "bool", "ignore common function words", default=True),
    ),
    needs_tokens=True,
    expected_rows=lambda args, n: _TYPICAL_SHARE * n,
)
