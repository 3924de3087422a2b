from __future__ import annotations

import json
import pathlib

import pytest

from sgl_ridgefill.calibration import CalibrationError, builtin_corpus, folder_corpus
from sgl_ridgefill.calibration import corpus as corpus_module
from sgl_ridgefill.calibration.corpus import Corpus, Document, Mixer, Source, iter_pieces, pick_heldout


def _doc(doc_id, source, size=100):
    return Document(doc_id, source, size, lambda: "x" * size)


def test_folder_reads_txt_and_jsonl(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha text")
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "first"}\n\n"second"\n')
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "ignored.md").write_text("not read")
    corpus = folder_corpus(tmp_path)
    assert [d.id for d in corpus.documents] == ["a.txt", "sub/b.jsonl:1", "sub/b.jsonl:3"]
    assert [d.text() for d in corpus.documents] == ["alpha text", "first", "second"]
    assert corpus.describe()["sources"][0]["documents_available"] == 3


def test_folder_errors(tmp_path):
    with pytest.raises(CalibrationError) as info:
        folder_corpus(tmp_path / "nope")
    assert str(info.value) == f"--corpus {tmp_path / 'nope'}: no such folder (give a folder of .txt/.jsonl files, or 'builtin')"
    with pytest.raises(CalibrationError) as info:
        folder_corpus(tmp_path)
    assert str(info.value) == f"--corpus {tmp_path}: the folder holds no .txt or .jsonl files"
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(CalibrationError) as info:
        folder_corpus(tmp_path)
    assert str(info.value) == f"--corpus {tmp_path}: all 1 .txt/.jsonl files are empty"
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": 3}\n')
    with pytest.raises(CalibrationError) as info:
        folder_corpus(tmp_path)
    assert str(info.value) == f"{tmp_path / 'bad.jsonl'}:2: expected a string or a JSON object with a 'text' string"
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(CalibrationError, match=r"bad\.jsonl:1: not valid JSON"):
        folder_corpus(tmp_path)


def test_order_is_deterministic_and_follows_the_weights():
    sources = (
        Source("prose", "", 0.5, tuple(_doc(f"p{i}", "prose") for i in range(30))),
        Source("code", "", 0.25, tuple(_doc(f"c{i}", "code") for i in range(30))),
        Source("docs", "", 0.25, tuple(_doc(f"d{i}", "docs") for i in range(30))),
    )
    corpus = Corpus("mix", sources)
    first = [d.id for d in corpus.ordered(0)]
    assert first == [d.id for d in corpus.ordered(0)]
    assert first != [d.id for d in corpus.ordered(1)]
    assert sorted(first) == sorted(d.id for d in corpus.documents)
    head = first[:40]  # while every source still has documents, prose gets half
    assert sum(i.startswith("p") for i in head) == 20
    assert sum(i.startswith("c") for i in head) == 10


def test_mixer_balances_sources_by_tokens_read_and_skips_ids():
    """A source of long documents (a book each) still gets only its share of what is read."""
    sources = (
        Source("books", "", 0.4, tuple(_doc(f"b{i}", "books", 5000) for i in range(10))),
        Source("code", "", 0.6, tuple(_doc(f"c{i}", "code", 300) for i in range(100))),
    )
    corpus = Corpus("mix", sources)
    read: dict[str, int] = {}
    mixer = Mixer(corpus, 0, read, skip={"b0", "c0"})
    picked = []
    while sum(read.values()) < 50_000:
        doc = mixer.next()
        picked.append(doc.id)
        read[doc.source] = read.get(doc.source, 0) + doc.size
    assert "b0" not in picked and "c0" not in picked
    share = read["books"] / sum(read.values())
    assert abs(share - 0.4) < 0.1
    again = Mixer(corpus, 0, {}, skip={"b0", "c0"})
    assert again.next().id == picked[0]
    rest = Mixer(corpus, 0, {}, skip={d.id for d in corpus.documents})
    assert rest.next() is None


def test_heldout_is_round_robin_over_sources_and_skips_unusable():
    order = [_doc("p0", "prose"), _doc("p1", "prose"), _doc("c0", "code"), _doc("c1", "code"), _doc("p2", "prose")]
    chosen = pick_heldout(order, 3, usable=lambda d: d.id != "p0")
    assert [d.id for d in chosen] == ["p1", "c0", "p2"]
    assert [d.id for d in pick_heldout(order, 9, usable=lambda d: True)] == ["p0", "c0", "p1", "c1", "p2"]


def test_pieces_cut_long_documents_and_drop_short_tails():
    tokens = list(range(10))
    assert list(iter_pieces(tokens, 4, 2)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(iter_pieces(tokens, 4, 3)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(iter_pieces(tokens[:2], 4, 3)) == []


def test_builtin_names_missing_packages_and_the_install_command(monkeypatch):
    monkeypatch.setattr(corpus_module.shutil, "which", lambda name: None)
    monkeypatch.setattr(corpus_module, "_BIBLE_DATA", pathlib.Path("/nonexistent/bible.data"))
    monkeypatch.setattr(corpus_module, "_DOC_ROOT", pathlib.Path("/nonexistent"))
    with pytest.raises(CalibrationError) as info:
        builtin_corpus()
    assert str(info.value) == (
        "--corpus builtin needs the Debian package(s) bible-kjv, bible-kjv-text, python3-doc, which are not "
        "installed; install them with: apt-get update && apt-get install -y bible-kjv bible-kjv-text python3-doc"
    )


def _builtin_installed() -> bool:
    try:
        builtin_corpus()
    except CalibrationError:
        return False
    return True


@pytest.mark.skipif(not _builtin_installed(), reason="Debian packages bible-kjv, bible-kjv-text, python3-doc not installed")
def test_builtin_mixes_real_prose_docs_and_code():
    corpus = builtin_corpus()
    names = [s.name for s in corpus.sources]
    assert names == ["kjv", "python-docs", "python-stdlib"]
    kjv = {d.id: d for d in corpus.sources[0].documents}
    assert len(kjv) == 66
    genesis = kjv["kjv/Ge"].text()
    assert genesis.startswith("Chapter 1\n\nIn the beginning God created the heaven and the earth.")
    assert "Ge1:1" not in genesis
    docs = corpus.sources[1].documents
    assert any(d.id == "python-docs/library/json.rst.txt" for d in docs)
    code = {d.id: d for d in corpus.sources[2].documents}
    assert "def " in code["python-stdlib/json/__init__.py"].text()
    assert not any("/test/" in i or "site-packages" in i for i in code)
    description = json.dumps(corpus.describe())
    assert "bible-kjv-text" in description


@pytest.mark.skipif(not _builtin_installed(), reason="Debian packages bible-kjv, bible-kjv-text, python3-doc not installed")
def test_parts_of_the_builtin_corpus():
    from sgl_ridgefill.calibration.corpus import open_corpus

    assert [s.name for s in open_corpus("builtin:code").sources] == ["python-stdlib"]
    assert [s.name for s in open_corpus("builtin:prose").sources] == ["kjv", "python-docs"]
    both = open_corpus("builtin:kjv,code")
    assert both.name == "builtin:kjv,code" and [s.name for s in both.sources] == ["kjv", "python-stdlib"]
    assert {d.id for d in both.documents} <= {d.id for d in builtin_corpus().documents}
    with pytest.raises(CalibrationError, match=r"^--corpus builtin:poetry: 'poetry' is no part of the builtin corpus; "
                                               r"parts: prose, code, or a source: kjv, python-docs, python-stdlib$"):
        open_corpus("builtin:poetry")
    with pytest.raises(CalibrationError, match="'' is no part"):
        open_corpus("builtin:")
