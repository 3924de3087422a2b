"""Calibration text: a user's folder of ``.txt``/``.jsonl`` files, or the ``builtin`` mix (or a part of it).

The ``builtin`` corpus is real text installed from Debian packages and the Python installation, a mix
of prose and code:

- ``kjv``: the King James Bible, one document per book (Debian ``bible-kjv`` + ``bible-kjv-text``);
- ``python-docs``: the Python documentation's reStructuredText sources (Debian ``python3-doc``);
- ``python-stdlib``: the running interpreter's standard library sources, one document per module.

``builtin:prose`` is the first two, ``builtin:code`` the third (``builtin:kjv`` etc.: one source), to fit maps
on one kind of text and measure them on another.

Documents keep their identity (held-out selection is by document, never by row) and are loaded lazily.
The reading order is deterministic for a seed: each source is shuffled on its own, then sources are
interleaved so that each gets its weight's share of the text read so far.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import sysconfig
from typing import Any, Callable, Iterable, Iterator

from .config import CalibrationError

# Debian packages the builtin corpus reads (CI installs these).
DEBIAN_PACKAGES = ("bible-kjv", "bible-kjv-text", "python3-doc")
_BIBLE_DATA = pathlib.Path("/usr/lib/bible.data")
_DOC_ROOT = pathlib.Path("/usr/share/doc")
_STDLIB_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "pydoc_data", "turtledemo", "ensurepip"}


@dataclasses.dataclass(frozen=True)
class Document:
    """One calibration document; ``size`` (characters or bytes) only steers the source mix."""

    id: str
    source: str
    size: int
    load: Callable[[], str] = dataclasses.field(repr=False, compare=False)

    def text(self) -> str:
        return self.load()


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    description: str
    weight: float
    documents: tuple[Document, ...]
    package: str | None = None  # "name version" of what supplied the text, when known


@dataclasses.dataclass(frozen=True)
class Corpus:
    name: str
    sources: tuple[Source, ...]

    @property
    def documents(self) -> list[Document]:
        return [doc for source in self.sources for doc in source.documents]

    def describe(self) -> dict[str, Any]:
        """JSON-safe description for manifests (what was available, not what was read)."""
        return {
            "name": self.name,
            "sources": [
                {"name": s.name, "description": s.description, "package": s.package, "weight": s.weight,
                 "documents_available": len(s.documents)}
                for s in self.sources
            ],
        }

    def shuffled(self, source: Source, seed: int) -> list[Document]:
        """``source``'s documents in its own deterministic order for ``seed``."""
        docs = list(source.documents)
        random.Random(f"{seed}:{source.name}").shuffle(docs)
        return docs

    def ordered(self, seed: int) -> list[Document]:
        """All documents in a deterministic order for ``seed``, sources interleaved by text size.

        Held-out documents are picked from this order; training reads through :class:`Mixer`, which
        balances sources by the tokens actually read.
        """
        queues = [collections.deque(self.shuffled(source, seed)) for source in self.sources]
        read = [0.0] * len(queues)
        order = []
        while any(queues):
            live = [i for i, q in enumerate(queues) if q]
            i = min(live, key=lambda k: (read[k] / self.sources[k].weight, k))
            doc = queues[i].popleft()
            read[i] += max(doc.size, 1)
            order.append(doc)
        return order


class Mixer:
    """Chooses the next training document from the source furthest below its weight's share of the
    tokens read so far, so the mix holds at any ``--max-tokens``, however long each source's documents.

    ``read``: tokens read per source name, updated by the caller (it persists across resumes); ``skip``:
    ids never to return (held-out and already-read documents).
    """

    def __init__(self, corpus: Corpus, seed: int, read: dict[str, int], skip: set[str]) -> None:
        self._sources = corpus.sources
        self._read = read
        self._queues = [
            collections.deque(d for d in corpus.shuffled(source, seed) if d.id not in skip) for source in corpus.sources
        ]

    def next(self) -> Document | None:
        live = [i for i, q in enumerate(self._queues) if q]
        if not live:
            return None
        i = min(live, key=lambda k: (self._read.get(self._sources[k].name, 0) / self._sources[k].weight, k))
        return self._queues[i].popleft()


def pick_heldout(order: list[Document], count: int, usable: Callable[[Document], bool]) -> list[Document]:
    """Choose ``count`` usable documents for held-out scoring, round-robin over sources in reading order."""
    by_source: dict[str, collections.deque[Document]] = collections.OrderedDict()
    for doc in order:
        by_source.setdefault(doc.source, collections.deque()).append(doc)
    chosen: list[Document] = []
    while len(chosen) < count and any(by_source.values()):
        for queue in by_source.values():
            while queue and len(chosen) < count:
                doc = queue.popleft()
                if usable(doc):
                    chosen.append(doc)
                    break
    return chosen


def _read_text(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _jsonl_documents(path: pathlib.Path, rel: str) -> Iterator[Document]:
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        text = record.get("text") if isinstance(record, dict) else record
        if not isinstance(text, str):
            raise CalibrationError(f"{path}:{lineno}: expected a string or a JSON object with a 'text' string")
        yield Document(f"{rel}:{lineno}", "folder", len(text), functools.partial(str, text))


def folder_corpus(folder: str | pathlib.Path) -> Corpus:
    """Every ``.txt`` file (one document) and ``.jsonl`` line (``{"text": ...}`` or a string) under ``folder``."""
    root = pathlib.Path(folder)
    if not root.is_dir():
        raise CalibrationError(f"--corpus {folder}: no such folder (give a folder of .txt/.jsonl files, or 'builtin')")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl"))
    if not files:
        raise CalibrationError(f"--corpus {folder}: the folder holds no .txt or .jsonl files")
    docs: list[Document] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".jsonl":
            docs.extend(_jsonl_documents(path, rel))
        elif path.stat().st_size > 0:
            docs.append(Document(rel, "folder", path.stat().st_size, functools.partial(_read_text, path)))
    if not docs:
        raise CalibrationError(f"--corpus {folder}: all {len(files)} .txt/.jsonl files are empty")
    return Corpus(str(root.resolve()), (Source("folder", f"text files under {root.resolve()}", 1.0, tuple(docs)),))


def _dpkg_version(package: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


@functools.lru_cache(maxsize=1)
def _kjv_books() -> tuple[tuple[str, str], ...]:
    """``(abbreviation, text)`` per book, from ``bible -f`` (one ``Ge1:1 text`` line per verse)."""
    result = subprocess.run(
        ["bible", "-f", "gen1:1-rev22:21"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=True
    )
    books: dict[str, list[str]] = collections.OrderedDict()
    verse = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")
    last_chapter: dict[str, str] = {}
    for line in result.stdout.splitlines():
        match = verse.match(line)
        if not match:
            continue
        book, chapter, _, text = match.groups()
        lines = books.setdefault(book, [])
        if last_chapter.get(book) != chapter:
            lines.append(f"\n\nChapter {chapter}\n\n")
            last_chapter[book] = chapter
        lines.append(text + " ")
    return tuple((book, "".join(parts).strip()) for book, parts in books.items())


def _kjv_source() -> Source:
    books = _kjv_books()
    docs = tuple(
        Document(f"kjv/{book}", "kjv", len(text), functools.partial(str, text)) for book, text in books
    )
    version = _dpkg_version("bible-kjv-text")
    return Source("kjv", "King James Bible, one document per book", 0.4, docs,
                  f"bible-kjv-text {version}" if version else "bible-kjv-text")


def _python_docs_root() -> pathlib.Path | None:
    # /usr/share/doc/python3.N/html/_sources; other python3.N-* folders may link to the same place.
    roots = [p for p in _DOC_ROOT.glob("python3.*/html/_sources") if re.fullmatch(r"python3\.\d+", p.parts[-3])]
    roots.sort(key=lambda p: int(p.parts[-3].split(".")[1]))
    return roots[-1] if roots else None


def _python_docs_source(root: pathlib.Path) -> Source:
    files = sorted(root.rglob("*.rst.txt"))
    docs = tuple(
        Document(f"python-docs/{p.relative_to(root).as_posix()}", "python-docs", p.stat().st_size,
                 functools.partial(_read_text, p))
        for p in files if p.stat().st_size > 0
    )
    package = root.parts[-3] + "-doc"  # /usr/share/doc/python3.11/html/_sources -> python3.11-doc
    version = _dpkg_version(package)
    return Source("python-docs", f"Python documentation sources ({root})", 0.3, docs,
                  f"{package} {version}" if version else package)


def _stdlib_source() -> Source:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        # Prune while walking: site-packages alone can hold hundreds of thousands of files.
        subfolders[:] = sorted(d for d in subfolders if d not in _STDLIB_SKIP)
        files.extend(pathlib.Path(folder) / n for n in names if n.endswith(".py"))
    files = sorted(p for p in files if p.stat().st_size > 0)
    docs = tuple(
        Document(f"python-stdlib/{p.relative_to(root).as_posix()}", "python-stdlib", p.stat().st_size,
                 functools.partial(_read_text, p))
        for p in files
    )
    version = ".".join(map(str, sys.version_info[:3]))
    return Source("python-stdlib", f"Python {version} standard library sources ({root})", 0.3, docs, f"python {version}")


def builtin_corpus() -> Corpus:
    """The builtin mix; raises :class:`CalibrationError` naming missing packages and the install command."""
    missing = []
    if shutil.which("bible") is None:
        missing.append("bible-kjv")
    if not _BIBLE_DATA.is_file():
        missing.append("bible-kjv-text")
    docs_root = _python_docs_root()
    if docs_root is None:
        missing.append("python3-doc")
    if missing:
        raise CalibrationError(
            f"--corpus builtin needs the Debian package(s) {', '.join(missing)}, which are not installed; "
            f"install them with: apt-get update && apt-get install -y {' '.join(DEBIAN_PACKAGES)}"
        )
    return Corpus("builtin", (_kjv_source(), _python_docs_source(docs_root), _stdlib_source()))


# Parts of the builtin corpus by kind of text, for ``builtin:<part>`` (a source's own name works too).
BUILTIN_PARTS = {"prose": ("kjv", "python-docs"), "code": ("python-stdlib",)}
BUILTIN = "builtin"


def open_corpus(spec: str) -> Corpus:
    """``"builtin"``; ``"builtin:<part>[,<part>]"``, some of it (a part of :data:`BUILTIN_PARTS` or a source's
    name: ``builtin:code``, ``builtin:kjv``); or a folder path."""
    if spec == BUILTIN:
        return builtin_corpus()
    if spec.startswith(BUILTIN + ":"):
        return builtin_part(spec)
    return folder_corpus(spec)


def builtin_part(spec: str) -> Corpus:
    """The sources ``spec`` (``builtin:<part>[,<part>]``) names, as a corpus of that name."""
    everything = builtin_corpus()
    known = {s.name for s in everything.sources}
    wanted: list[str] = []
    for part in (p.strip() for p in spec.split(":", 1)[1].split(",")):
        names = BUILTIN_PARTS.get(part, (part,))
        if not part or any(n not in known for n in names):
            raise CalibrationError(
                f"--corpus {spec}: {part!r} is no part of the builtin corpus; parts: {', '.join(BUILTIN_PARTS)}, "
                f"or a source: {', '.join(sorted(known))}"
            )
        wanted += [n for n in names if n not in wanted]
    return Corpus(spec, tuple(s for s in everything.sources if s.name in wanted))


def iter_pieces(tokens: list[int], doc_tokens: int, min_doc_tokens: int) -> Iterable[list[int]]:
    """Cut a document's tokens into forward passes of at most ``doc_tokens``; drop a short trailing piece."""
    for start in range(0, len(tokens), doc_tokens):
        piece = tokens[start : start + doc_tokens]
        if len(piece) >= min_doc_tokens:
            yield piece
