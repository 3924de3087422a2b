"""Needle tasks: exact lengths, needle spans, region labels, determinism, RULER scoring, errors."""

from __future__ import annotations

import collections
import pathlib
import re
import shutil
import sysconfig

import pytest

from sgl_ridgefill.eval.haystack import FALLBACK_WORDS, NOISE, extract_words, open_haystack, text_haystack
from sgl_ridgefill.eval.needles import TASKS, depth_grid, make_sample, make_samples, string_match_all

TAIL = 128
NIAH = [t for t in TASKS if t.startswith("niah_")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A folder haystack: a few standard-library modules saved as ``.txt``."""
    root = tmp_path_factory.mktemp("stdlib_text")
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "difflib.py", "argparse.py"):
        shutil.copy(stdlib / name, root / f"{name}.txt")
    return str(root)


def _decode(tok, sample, span) -> str:
    return tok.decode(list(sample.input_ids[span[0]:span[1]]))


def _region(sample, tail) -> str:
    boundary = sample.length - tail
    if all(b <= boundary for _, b in sample.needle_spans):
        return "filled"
    if all(a >= boundary for a, _ in sample.needle_spans):
        return "tail"
    return "straddle"


@pytest.mark.parametrize("task", TASKS)
def test_exact_length_and_position(tok, folder, task):
    lengths = (600, 1000, 2048) if task in NIAH else (1000, 2048)  # vt and cwe carry a one-shot example
    for haystack in ("noise", folder):
        for length in lengths:
            position = length * 3 // 5  # past vt's one-shot example
            sample = make_sample(tok, task, length, TAIL, position, haystack=haystack)
            assert len(sample.input_ids) == sample.length == length
            assert all(isinstance(i, int) for i in sample.input_ids)
            if task != "cwe":
                assert sample.needle_spans[0][0] == position
                assert sample.haystack == ("noise" if haystack == "noise" else pathlib.Path(folder).name)
                assert sample.id == f"{task}/{sample.haystack}/{length}/0/0"
            else:
                assert sample.haystack == "words" and sample.id == f"cwe/words/{length}/0/0"
            assert sample.depth == sample.needle_spans[0][0] / length
            assert sample.region == _region(sample, TAIL)


def test_niah_spans_hold_keys_and_values(tok):
    for task in NIAH:
        sample = make_sample(tok, task, 2048, TAIL, 700, seed=3)
        texts = [_decode(tok, sample, s) for s in sample.needle_spans]
        assert all(t.startswith("One of the special magic numbers for ") for t in texts)
        assert sorted(v for t in texts for v in re.findall(r"\d{7}", t)) == sorted(sample.answers)
        prompt = tok.decode(list(sample.input_ids))
        key = re.match(r"One of the special magic numbers for (\S+) is", texts[0]).group(1)
        assert prompt.endswith("mentioned in the provided text " + ("is" if len(sample.answers) == 1 else "are"))
        assert key in prompt.rsplit("\nWhat ", 1)[1]
        needles = prompt.count("One of the special magic numbers for ")
        assert needles == (4 if task == "niah_multikey" else len(sample.answers))
        expected_answers = 4 if task in ("niah_multivalue", "niah_multiquery") else 1
        assert len(sample.answers) == expected_answers and len(sample.needle_spans) == expected_answers
        # Relevant needles sit together, a few hundred tokens at most after the first.
        assert sample.needle_spans[-1][1] - sample.needle_spans[0][0] < 400


def test_multikey_distractors_are_not_spans(tok):
    sample = make_sample(tok, "niah_multikey", 2048, TAIL, 1000)
    prompt = tok.decode(list(sample.input_ids))
    values = re.findall(r"magic numbers for \S+ is: (\d{7})\.", prompt)
    assert len(values) == 4 and sample.answers[0] in values
    span_text = _decode(tok, sample, sample.needle_spans[0])
    assert [v for v in values if v in span_text] == [sample.answers[0]]


def test_multikey_samples_carry_questions_about_their_other_keys(tok):
    """The later-question arms ask about the distractors' keys first: each other prompt is the sample's own
    document followed by a question about one of them; other tasks have none."""
    sample = make_sample(tok, "niah_multikey", 2048, TAIL, 1000)
    doc = sample.input_ids[: sample.length - sample.question_len]
    own = tok.decode(list(sample.input_ids[len(doc):]))
    keys = re.findall(r"magic numbers? for (\S+) is: \d{7}\.", tok.decode(list(doc)))
    asked = re.search(r"magic number for (\S+) mentioned", own).group(1)
    assert len(sample.other_questions) == 3 and asked in keys
    others = []
    for i in range(3):
        prompt = sample.other_prompt(i)
        assert prompt[: len(doc)] == doc
        others.append(re.search(r"magic number for (\S+) mentioned", tok.decode(list(prompt[len(doc):]))).group(1))
    assert sorted(others + [asked]) == sorted(keys)
    assert make_sample(tok, "niah_single", 2048, TAIL, 1000).other_questions == ()


def test_multikey_samples_carry_their_other_keys_values(tok):
    """A wrong answer can be read as another key's value only if the record knows those values."""
    sample = make_sample(tok, "niah_multikey", 2048, TAIL, 1000)
    values = re.findall(r"magic numbers for \S+ is: (\d{7})\.", tok.decode(list(sample.input_ids)))
    assert sorted(sample.distractor_answers) == sorted(v for v in values if v not in sample.answers)
    assert len(sample.distractor_answers) == 3
    assert make_sample(tok, "niah_single", 2048, TAIL, 1000).distractor_answers == ()


def test_vt_spans_are_the_chain(tok):
    sample = make_sample(tok, "vt", 2048, TAIL, 500, seed=1)
    texts = [_decode(tok, sample, s) for s in sample.needle_spans]
    names = sample.answers
    assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    assert texts[0].startswith(f"VAR {names[0]} = ")
    value = texts[0].split("= ")[1]
    for i in range(1, 5):
        assert texts[i] == f"VAR {names[i]} = VAR {names[i - 1]}"
    assert tok.decode(list(sample.input_ids)).endswith(f"assigned the value {value}, they are: ")


def test_cwe_common_words_recur_most(tok, folder):
    for length in (1000, 5000):  # both of RULER's repeat regimes (below and from 4096 tokens)
        sample = make_sample(tok, "cwe", length, TAIL, 0, haystack=folder)
        assert len(sample.answers) == 10
        prompt = tok.decode(list(sample.input_ids))
        listed = prompt.split("Memorize the ones that appear most often.\n")[-1].split("\nQuestion:")[0]
        items = re.findall(r"(\d+)\. ([a-z]+)", listed)
        assert [int(n) for n, _ in items] == list(range(1, len(items) + 1))
        counts = collections.Counter(w for _, w in items)
        assert min(counts[w] for w in sample.answers) > max(c for w, c in counts.items() if w not in sample.answers)
        assert len(sample.needle_spans) == sum(counts[w] for w in sample.answers)
        assert all(any(w in _decode(tok, sample, s) for w in sample.answers) for s in sample.needle_spans)


def test_cwe_is_filled_only_when_every_occurrence_is(tok):
    """The word list spans the context: a cwe sample whose tail holds occurrences is not filled-region."""
    sample = make_sample(tok, "cwe", 2048, TAIL, 0)
    ends = sorted(b for _, b in sample.needle_spans)
    assert sample.region == ("filled" if ends[-1] <= 2048 - TAIL else "straddle")
    whole = make_sample(tok, "cwe", 2048, 2048 - ends[-1], 0)
    assert whole.region == "filled" and whole.input_ids == sample.input_ids


def test_region_labels_against_tail(tok):
    length = 2048
    boundary = length - TAIL
    filled = make_sample(tok, "niah_single", length, TAIL, 600)
    straddle = make_sample(tok, "niah_single", length, TAIL, boundary - 4)
    tail = make_sample(tok, "niah_single", length, TAIL, boundary + 8)
    assert (filled.region, straddle.region, tail.region) == ("filled", "straddle", "tail")
    # Multi-needle blocks stay in their first needle's region when there is room.
    for task in ("niah_multivalue", "niah_multiquery", "vt"):
        assert make_sample(tok, task, length, TAIL, boundary - 300).region == "filled"
        assert make_sample(tok, task, 4096, 1024, 4096 - 1000).region == "tail"


def test_depth_grid_straddles_the_boundary():
    grid = depth_grid(4096, 512)
    boundary = 4096 - 512
    assert grid[:5] == tuple(int(f * boundary) for f in (0.05, 0.23, 0.41, 0.59, 0.77))
    assert grid[5:] == (boundary - 256, boundary - 32, boundary + 32, boundary + 256)
    assert depth_grid(4096, 512, n_filled=2)[:2] == (int(0.05 * boundary), int(0.5 * boundary))
    small = depth_grid(300, 100, n_filled=3)
    assert all(0 <= p < 300 for p in small) and len(set(small)) == len(small) and 0 in small
    assert max(depth_grid(1000, 0)) == 999


def test_make_samples_cover_regions_and_are_deterministic(tok, folder):
    tail = 512  # room in the tail for a block of four needles
    kwargs = dict(haystacks=("noise", folder), seeds=(0, 1))
    samples = make_samples(tok, TASKS, [2048], tail, **kwargs)
    assert len({s.id for s in samples}) == len(samples)
    assert [s.input_ids for s in samples] == [s.input_ids for s in make_samples(tok, TASKS, [2048], tail, **kwargs)]
    by_task = collections.defaultdict(list)
    for s in samples:
        by_task[s.task].append(s)
        assert len(s.input_ids) == 2048
        if s.task != "cwe":
            assert s.region == _region(s, tail)
    assert [s.id for s in by_task["cwe"]] == ["cwe/words/2048/0/0", "cwe/words/2048/0/1"]
    for task in NIAH + ["vt"]:
        regions = {s.region for s in by_task[task]}
        assert {"filled", "tail"} <= regions
        assert {s.haystack for s in by_task[task]} == {"noise", pathlib.Path(folder).name}
    assert make_sample(tok, "niah_single", 2048, TAIL, 900, seed=0) != make_sample(tok, "niah_single", 2048, TAIL, 900, seed=1)
    assert make_sample(tok, "vt", 2048, TAIL, 900) == make_sample(tok, "vt", 2048, TAIL, 900)


def test_string_match_all_as_ruler():
    # RULER scripts/eval/synthetic/constants.py: share of references found, case-insensitive, x 100.
    assert string_match_all("The special magic numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 100.0
    assert string_match_all(" 1234567. Also 42.", ["1234567", "7654321"]) == 50.0
    assert string_match_all(" 1. Apple 2. banana 3. grape", ["apple", "banana", "cherry"]) == pytest.approx(200 / 3)
    assert string_match_all(" ABCDE FGHIJ", ("abcde",)) == 100.0
    assert string_match_all("", ["x"]) == 0.0
    with pytest.raises(ValueError, match="answers is empty"):
        string_match_all("x", [])


def test_errors_name_the_value(tok, tmp_path):
    with pytest.raises(ValueError, match="'niah_double'"):
        make_sample(tok, "niah_double", 1000, TAIL, 500)
    with pytest.raises(ValueError, match="no_such_folder"):
        make_sample(tok, "niah_single", 1000, TAIL, 500, haystack=str(tmp_path / "no_such_folder"))
    with pytest.raises(ValueError, match="length 80 is too small"):
        make_sample(tok, "niah_single", 80, 10, 40)
    with pytest.raises(ValueError, match="length 300 is too small for 'cwe'"):
        make_sample(tok, "cwe", 300, 10, 0)
    with pytest.raises(ValueError, match="needs more distinct words than the 'noise' word list"):
        make_sample(tok, "cwe", 30000, 10, 0, haystack="noise")
    for position in (0, 999, -5):
        with pytest.raises(ValueError, match=f"position {position} is out of range"):
            make_sample(tok, "niah_single", 1000, TAIL, position)
    with pytest.raises(ValueError, match="tail"):
        make_sample(tok, "niah_single", 1000, 1000, 500)
    with pytest.raises(ValueError, match="length"):
        depth_grid(0, 0)
    with pytest.raises(ValueError, match="n_filled"):
        depth_grid(1000, 100, n_filled=-1)
    with pytest.raises(ValueError, match="haystacks is empty"):
        make_samples(tok, ["niah_single"], [1000], TAIL, haystacks=())


def test_bos_is_prepended_when_the_tokenizer_adds_it(tok):
    from tokenizers import processors

    bos_tok = tok.__class__(tokenizer_object=tok.backend_tokenizer.__class__.from_str(tok.backend_tokenizer.to_str()),
                            eos_token="<|endoftext|>", bos_token="<|bos|>")
    bos = bos_tok.bos_token_id
    bos_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", bos)])
    assert bos_tok("a")["input_ids"][0] == bos
    sample = make_sample(bos_tok, "niah_single", 1000, TAIL, 400)
    assert sample.input_ids[0] == bos and sample.input_ids.count(bos) == 1 and len(sample.input_ids) == 1000
    assert sample.answers[0] in _decode(bos_tok, sample, sample.needle_spans[0])
    assert make_sample(tok, "niah_single", 1000, TAIL, 400).input_ids[0] != bos


def test_haystack_words_and_documents(folder, tmp_path):
    assert open_haystack("noise").words == FALLBACK_WORDS
    assert next(open_haystack("noise").documents())[1] == NOISE
    assert len(FALLBACK_WORDS) >= 300 and len(set(FALLBACK_WORDS)) == len(FALLBACK_WORDS)
    words = open_haystack(folder).words
    assert words != FALLBACK_WORDS and all(re.fullmatch(r"[a-z]{4,10}", w) for w in words)
    assert len(set(words)) == len(words)
    assert extract_words(["The cat sat, cat: Dogs :func:`x` dogs dogs elephantine-ish.", "cats dogs"]) == ("dogs",)
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.txt").write_text("only a handful of words here, words words")
    assert open_haystack(str(small)).words == FALLBACK_WORDS
    docs = [doc_id for doc_id, _ in open_haystack(folder).documents(seed=0)]
    assert sorted(docs) == ["argparse.py.txt", "difflib.py.txt", "textwrap.py.txt"]
    kept = [doc_id for doc_id, _ in open_haystack(folder).documents({"difflib.py.txt"}, seed=0)]
    assert kept == [d for d in docs if d != "difflib.py.txt"]


def test_excluded_documents_leave_the_haystack(tok, folder):
    first = next(open_haystack(folder).documents(seed=0))[0]
    a = make_sample(tok, "niah_single", 1000, TAIL, 500, haystack=folder)
    b = make_sample(tok, "niah_single", 1000, TAIL, 500, haystack=folder, exclude_ids={first})
    assert a.input_ids != b.input_ids and a.answers == b.answers


def test_text_haystack_is_builtin_prose(tok):
    try:
        from sgl_ridgefill.calibration.corpus import builtin_corpus

        builtin_corpus()
    except Exception as exc:  # the Debian text packages are not installed
        pytest.skip(f"builtin corpus unavailable: {exc}")
    docs = text_haystack(seed=0)
    ids = [next(docs)[0] for _ in range(20)]
    assert all(i.split("/")[0] in ("kjv", "python-docs") for i in ids)
    assert ids[0] not in [i for i, _ in zip((d for d, _ in text_haystack({ids[0]}, seed=0)), range(20))]
    sample = make_sample(tok, "niah_multikey", 2048, TAIL, 700, haystack="text")
    assert len(sample.input_ids) == 2048 and sample.haystack == "text"
    assert len(open_haystack("text").words) > 5000


def test_code_haystack_is_the_builtin_code(tok):
    try:
        from sgl_ridgefill.calibration.corpus import builtin_corpus

        builtin_corpus()
    except Exception as exc:  # the Debian text packages are not installed
        pytest.skip(f"builtin corpus unavailable: {exc}")
    code = open_haystack("code")
    ids = [doc_id for doc_id, _ in zip((d for d, _ in code.documents(seed=0)), range(20))]
    assert code.name == "code" and all(i.split("/")[0] == "python-stdlib" for i in ids)
    assert "def" in next(code.documents(seed=0))[1] or "import" in next(code.documents(seed=0))[1]
    sample = make_sample(tok, "niah_single", 2048, TAIL, 700, haystack="code")
    assert len(sample.input_ids) == 2048 and sample.haystack == "code" and sample.id.startswith("niah_single/code/")
    with pytest.raises(ValueError, match="expected 'noise', 'text', 'code' or a folder"):
        open_haystack("poetry")
