"""Haystacks for the needle tasks: RULER's noise sentences, real prose, or a folder of text files.

A haystack is an endless token stream (documents tokenized in a fixed order, cycled when they run out)
plus a word list for needle keys and the common-words task:

- ``"noise"``: RULER's noise paragraph repeated, one per line; words from :data:`FALLBACK_WORDS`;
- ``"text"``: the prose of the builtin calibration corpus (King James Bible and the Python documentation,
  Debian packages ``bible-kjv``, ``bible-kjv-text``, ``python3-doc``); words from that prose;
- ``"code"``: its code (the Python standard library's sources); words from that code;
- a folder path: every ``.txt``/``.jsonl`` document under it; words from its text, or
  :data:`FALLBACK_WORDS` when it holds fewer than :data:`MIN_WORDS` distinct words.

Documents a map was fitted on can be left out (``exclude_ids``) so that retrieval is scored on unseen
text. The calibration package imports torch, so it is imported here only when a text haystack is opened.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import pathlib
import random
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from sgl_ridgefill.calibration.corpus import Corpus

# RULER's noise haystack (scripts/data/synthetic/niah.py), one copy per line.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# Haystacks of the builtin corpus' parts (``calibration.corpus.BUILTIN_PARTS``), by their names here.
BUILTIN_HAYSTACKS = {"text": "builtin:prose", "code": "builtin:code"}
MAX_WORDS = 20000
MIN_WORDS = 300  # fewer distinct words than this in a text haystack: use FALLBACK_WORDS instead
_DOC_SEPARATOR = "\n\n"
_CHUNK_CHARS = 16384  # documents are tokenized in chunks cut at whitespace, so streams share prefixes
_STRIP = ".,;:!?\"'()[]{}`*<>"

# Used when no real text is at hand; common English words of 4..10 lowercase letters.
FALLBACK_WORDS = tuple("""
able about above accept across action active actor actual address admit adult affect after again
against agency agent agree ahead allow almost alone along already also although always among amount
analysis animal another answer anyone anything appear apply approach area argue around arrive article
artist assume attack attention author avoid away baby back bank base beat beautiful because become
before begin behavior behind believe benefit best better between beyond bill black blood blue board
body book born both break bring brother budget build building business call camera campaign cancer
capital card care career carry case catch cause cell center central century certain chair challenge
chance change character charge check child choice choose church citizen city civil claim class clear
close coach cold collection college color come commercial common community company compare computer
concern condition conference consider contain continue control cost could country couple course court
cover create crime cultural culture current customer dark data daughter dead deal death debate decade
decide decision deep defense degree describe design despite detail determine develop difference
different difficult dinner direction director discover discuss disease doctor door down draw dream
drive drop drug during each early east easy economic economy edge education effect effort eight either
election else employee energy enjoy enough enter entire evening event ever every evidence exactly
example executive exist expect experience expert explain face fact factor fail fall family fast father
fear federal feel feeling field fight figure fill film final finally financial find fine finger finish
fire firm first fish five floor focus follow food foot force foreign forget form former forward four
free friend from front full fund future game garden general generation girl give glass goal good
government great green ground group grow growth guess hair half hand happen happy hard have head health
hear heart heat heavy help here herself high himself history hold home hope hospital hotel hour house
however huge human hundred husband idea identify image imagine impact important improve include
increase indeed indicate industry inside instead interest interview into investment issue itself
join just keep kind kitchen know knowledge land language large last late later laugh lawyer lead
leader learn least leave left legal less letter level life light like likely line list listen little
live local long look lose loss love machine magazine main maintain major manage manager market
marriage material matter maybe mean measure media medical meet meeting member memory mention message
method middle might military million mind minute miss mission model modern moment money month more
morning most mother mouth move movement movie much music must myself name nation national natural
nature near nearly necessary need network never news newspaper next nice night none north note nothing
notice number occur offer office officer official often once only onto open operation option order
organize other outside owner page pain painting paper parent part partner party pass past patient
pattern peace people perform perhaps period person personal phone physical pick picture piece place
plan plant play player point police policy political poor popular position positive possible power
practice prepare present pressure pretty prevent price private probably problem process produce
product program project property protect prove provide public pull purpose push quality question
quickly quite race radio raise range rate rather reach read ready real reality realize reason receive
recent record reduce reflect region relate remain remember remove report represent require research
resource respond rest result return reveal rich right rise risk road rock role room rule safe same
save scene school science score season seat second section security seek seem sell send senior sense
series serious serve service seven several shake share shoot short shoulder show side sign similar
simple simply since sing single sister site situation size skill small smile social society soldier
some somebody someone something sometimes song soon sort sound source south southern space speak
special specific speech spend sport spring staff stage stand standard star start state station stay
step still stock stop store story strategy street strong student study stuff style subject success
suddenly suffer suggest summer support sure surface system table take talk task teach teacher team
technology television tell tend term test than thank that their them themselves then theory there
these they thing think third this those though thought thousand threat three through throughout throw
thus time today together tonight total tough toward town trade training travel treat treatment tree
trial trip trouble true truth turn type under understand unit until upon usually value various very
victim view violence visit voice vote wait walk wall want watch water weapon wear week weight well
west western what whatever when where whether which while white whole whom whose wide wife will wind
window wish with within without woman wonder word work worker world worry would write writer wrong
yard yeah year young yourself
""".split())


@dataclasses.dataclass(frozen=True)
class Haystack:
    """Where filler text comes from. ``name`` is ``"noise"``, ``"text"`` or the folder's name (it goes
    into sample ids); ``corpus`` is ``None`` for noise."""

    name: str
    corpus: Corpus | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def is_noise(self) -> bool:
        return self.corpus is None

    def documents(self, exclude_ids: Iterable[str] = frozenset(), seed: int = 0) -> Iterator[tuple[str, str]]:
        """``(doc_id, text)`` once each, in a deterministic order for ``seed``, skipping ``exclude_ids``;
        noise yields one endless line of RULER's noise per item."""
        if self.corpus is None:
            yield from (("noise", NOISE) for _ in itertools.count())
            return
        excluded = frozenset(exclude_ids)
        for doc in self.corpus.ordered(seed):
            if doc.id not in excluded:
                yield doc.id, doc.text()

    def tokens(self, tokenizer: Any, n: int, *, seed: int = 0, exclude_ids: Iterable[str] = frozenset()) -> list[int]:
        """The first ``n`` token ids of this haystack's stream for ``seed``.

        Noise is its line (with a newline) tokenized once and repeated. Text documents are separated by a
        blank line and tokenized in whitespace-cut chunks, so a longer stream starts with a shorter one;
        when the documents run out they are read again from the first.
        """
        if n <= 0:
            return []
        if self.corpus is None:
            unit = _encode(tokenizer, NOISE + "\n")
            return (unit * (n // len(unit) + 1))[:n]
        out: list[int] = []
        for _ in range(1 + n):  # each round reads every document once and adds at least one token
            read_any = False
            for _, text in self.documents(exclude_ids, seed):
                read_any = True
                for chunk in _chunks(text + _DOC_SEPARATOR):
                    out.extend(_encode(tokenizer, chunk))
                    if len(out) >= n:
                        return out[:n]
            if not read_any:
                raise ValueError(f"haystack {self.name!r}: every document is in exclude_ids; nothing left to read")
        raise ValueError(f"haystack {self.name!r}: its documents tokenize to nothing")

    @functools.cached_property
    def words(self) -> tuple[str, ...]:
        """Distinct lowercase alphabetic words of 4..10 letters in first-seen order (at most
        :data:`MAX_WORDS`); :data:`FALLBACK_WORDS` for noise or when the text has fewer than :data:`MIN_WORDS`."""
        if self.corpus is None:
            return FALLBACK_WORDS
        found = extract_words(doc.text() for doc in self.corpus.documents)
        return found if len(found) >= MIN_WORDS else FALLBACK_WORDS


def extract_words(texts: Iterable[str], limit: int = MAX_WORDS, min_count: int = 2) -> tuple[str, ...]:
    """Whitespace-separated words, stripped of surrounding punctuation, kept when they are 4..10 ASCII
    lowercase letters (so markup such as ``:func:`x``` and capitalised names are left out) and occur at
    least ``min_count`` times (which drops most identifiers from code samples); first-seen order."""
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
        for raw in text.split():
            word = raw.strip(_STRIP)
            if 4 <= len(word) <= 10 and word.isascii() and word.isalpha() and word.islower():
                counts[word] += 1
    return tuple(itertools.islice((w for w, c in counts.items() if c >= min_count), limit))


@functools.lru_cache(maxsize=16)
def open_haystack(spec: str) -> Haystack:
    """``"noise"``, ``"text"`` (the builtin corpus' prose), ``"code"`` (its code) or a folder of ``.txt``/``.jsonl``
    files.

    Raises ``ValueError`` (the calibration package's ``CalibrationError``) for a missing folder or
    missing Debian packages.
    """
    if spec == "noise":
        return Haystack("noise")
    if spec in BUILTIN_HAYSTACKS:
        from sgl_ridgefill.calibration.corpus import Corpus, open_corpus

        return Haystack(spec, Corpus(spec, open_corpus(BUILTIN_HAYSTACKS[spec]).sources))
    if not pathlib.Path(spec).is_dir():
        raise ValueError(f"haystack {spec!r}: expected 'noise', {', '.join(map(repr, BUILTIN_HAYSTACKS))} or a folder "
                         "of .txt/.jsonl files")
    from sgl_ridgefill.calibration.corpus import folder_corpus

    return Haystack(pathlib.Path(spec).resolve().name, folder_corpus(spec))


def text_haystack(exclude_ids: Iterable[str] = frozenset(), seed: int = 0) -> Iterator[tuple[str, str]]:
    """The builtin prose (``kjv`` and ``python-docs``) as ``(doc_id, text)``, in a deterministic order
    for ``seed``, skipping ``exclude_ids`` (the documents a map was fitted on)."""
    return open_haystack("text").documents(exclude_ids, seed)


class StreamCache:
    """Token streams per (haystack, seed, excluded ids) for one tokenizer, so samples that differ only in
    length or needle position tokenize the haystack once."""

    def __init__(self, tokenizer: Any, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens  # read at least this much on a miss (the longest prompt planned)
        self._streams: dict[tuple[str, int, frozenset[str]], list[int]] = {}

    def take(self, haystack: Haystack, n: int, seed: int, exclude_ids: Iterable[str] = frozenset()) -> list[int]:
        key = (haystack.name, seed, frozenset(exclude_ids))
        stream = self._streams.get(key)
        if stream is None or len(stream) < n:
            stream = haystack.tokens(self.tokenizer, max(n, self.min_tokens), seed=seed, exclude_ids=key[2])
            self._streams[key] = stream
        return stream[:n]


def sample_words(words: tuple[str, ...], count: int, rng: random.Random, *, what: str) -> list[str]:
    """``count`` distinct words drawn with ``rng``; ``ValueError`` naming ``what`` needs them if too few."""
    if count > len(words):
        raise ValueError(f"{what} needs {count} distinct words; the word list has only {len(words)}")
    return rng.sample(words, count)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chunks(text: str) -> Iterator[str]:
    """``text`` in pieces of about :data:`_CHUNK_CHARS` characters, each ending after whitespace."""
    start = 0
    while start < len(text):
        end = start + _CHUNK_CHARS
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = cut + 1 if cut > start else end
        yield text[start:end]
        start = end
