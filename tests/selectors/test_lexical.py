from __future__ import annotations

from sgl_ridgefill.selectors.lexical import _segment_words, lexical_net

from .helpers import inputs, table_and_ids

S1 = [" alpha", " beta", " gamma", " delta", " omega", "."]  # rows 0-5
S2 = [" alpha", " beta", " gamma", " delta", "."]  # rows 6-10
S3 = [" alpha", " beta", " gamma", " delta", "."]  # rows 11-15
S4 = [" kappa", " lambda", "."]  # rows 16-18
QUESTION = [" alpha", " beta", " gamma", " delta", " omega", "?"]  # rows 19-24 (the tail)
DEFAULTS = dict(min_shared=4, query_tokens=5, max_count=2, rows_per_sentence=80, stopwords=True)


def _run(words, prefix_len, **kw):
    table, ids = table_and_ids(words)
    return lexical_net(inputs(ids, prefix_len, tokens=table), **{**DEFAULTS, **kw}).tolist()


def test_sentence_sharing_four_words_with_a_rare_one():
    # Prefix counts: alpha..delta 3 times each, omega, kappa, lambda once. S1 shares 5 words and holds
    # omega (rare); S2 and S3 share 4 but hold no word seen at most twice; S4 shares none.
    assert _run(S1 + S2 + S3 + S4 + QUESTION, 19) == [0, 1, 2, 3, 4, 5]


def test_rows_per_sentence_cap():
    assert _run(S1 + S2 + S3 + S4 + QUESTION, 19, rows_per_sentence=3) == [0, 1, 2]


def test_more_shared_words_rank_first():
    # With max_count=3 every alpha..delta word is rare: S2 and S3 (4 shared) follow S1 (5 shared).
    assert _run(S1 + S2 + S3 + S4 + QUESTION, 19, max_count=3) == list(range(0, 16))
    assert _run(S2 + S1 + S3 + S4 + QUESTION, 19, max_count=3) == [5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4, 11, 12, 13, 14, 15]


def test_min_shared_threshold():
    assert _run(S1 + S2 + S3 + S4 + QUESTION, 19, min_shared=6) == []


def test_stopwords_never_count_as_shared():
    s = [" the", " with", " from", " into", " kappa", "."]
    question = [" the", " with", " from", " into", "?"]
    assert _run(s + question, 6, query_tokens=4) == []
    assert _run(s + question, 6, query_tokens=4, stopwords=False) == [0, 1, 2, 3, 4, 5]


def test_sentences_reaching_into_the_question_window_are_skipped():
    # The question window (last 5 content tokens) starts inside the prefix: the sentence holding it
    # would match itself and is skipped.
    assert _run(S1 + QUESTION, 9) == [0, 1, 2, 3, 4, 5]
    assert _run(S1[:-1] + QUESTION, 8) == []


def test_a_hyphenated_word_counts_as_its_parts_however_the_tokenizer_splits_it():
    # "special magic forasmuch-kernel" shares four words with the question only if the hyphen separates
    # "forasmuch" from "kernel"; Qwen's tokenizer glues the hyphen to the next piece ("-k", "ernel"), SmolLM2's
    # keeps it alone: the same sentence is found with either.
    for key in ([" for", "asm", "uch", "-k", "ernel"], [" for", "asm", "uch", "-", "kernel"]):
        needle = [" One", " special", " magic", *key, " is", " 385", "."]  # rows 0-10 (11 rows)
        other = [" special", " magic", " alpha", "."]  # rows 11-14: two shared words only
        question = [" special", " magic", *key, "?"]
        content = sum(any(c.isalnum() for c in piece) for piece in question)
        n = len(needle) + len(other)
        assert _run(needle + other + question, n, query_tokens=content) == list(range(len(needle)))


def test_word_segmentation():
    texts = ["ab", "cd", "ef", ".", "gh", "ij", "kl"]
    alnum = [True, True, True, False, True, True, True]
    starts = [True, False, True, False, True, False, True]
    assert _segment_words(texts, alnum, starts) == (["abcd", "ef", "ghij", "kl"], [0, 2, 4, 6], [0, 0, 1, -1, 2, 2, 3])


def test_one_long_unbroken_run_is_one_word():
    # A 200K-token run (a base64 blob) is one word, built once: joining its pieces is linear in the run.
    n = 200_000
    words, first, word_at = _segment_words(["q9z"] * n, [True] * n, [True] + [False] * (n - 1))
    assert words == ["q9z" * n] and first == [0] and word_at == [0] * n


def test_a_long_blob_does_not_change_the_sentences_found():
    blob = [" blob"] + ["x9"] * 20_000 + ["."]
    n = len(blob)
    assert _run(blob + S1 + S2 + S3 + S4 + QUESTION, n + 19) == list(range(n, n + 6))
