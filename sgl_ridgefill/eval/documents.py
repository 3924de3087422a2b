"""Long real documents for the loss metrics, cut to an exact token length with the served model's tokenizer.

They come from the same Debian and Python registry packages as the builtin calibration corpus
(``calibration/corpus.py``), taking turns between its sources (Bible books, Python documentation, Python
standard library sources), and leave out every document the maps were fitted or validated on (the maps
manifest's ``read_ids`` and ``heldout_ids``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True)
class LongDocument:
    id: str
    source: str
    prompt_ids: tuple[int, ...]  # exactly ``length`` tokens
    has_bos: bool = False  # prompt_ids[0] is the tokenizer's BOS


def calibration_ids(maps_dir: str | pathlib.Path | None) -> frozenset[str]:
    """Documents a maps folder was fitted or validated on (empty when the manifest does not list them)."""
    if maps_dir is None:
        return frozenset()
    manifest = json.loads((pathlib.Path(maps_dir) / "manifest.json").read_text())
    calib = manifest.get("calibration") or {}
    return frozenset(calib.get("read_ids") or ()) | frozenset(calib.get("heldout_ids") or ())


def long_documents(
    tokenizer: Any, length: int, count: int, *, corpus: str = "builtin", exclude: Iterable[str] = (), seed: int = 1
) -> list[LongDocument]:
    """``count`` documents of at least ``length`` tokens, each cut to its first ``length`` tokens.

    Raises ``ValueError`` when the corpus has fewer such documents."""
    from ..calibration.corpus import open_corpus
    from .needles import bos_prefix

    corpus_obj = open_corpus(corpus)
    skip = set(exclude)
    queues = [[d for d in corpus_obj.shuffled(source, seed) if d.id not in skip] for source in corpus_obj.sources]
    bos = bos_prefix(tokenizer)
    out: list[LongDocument] = []
    for doc in itertools.chain.from_iterable(itertools.zip_longest(*queues)):
        if doc is None:
            continue
        if doc.size < length:  # characters: fewer than one per token can never reach the length
            continue
        ids = bos + tokenizer(doc.text(), add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) < length:
            continue
        out.append(LongDocument(doc.id, doc.source, tuple(ids[:length]), has_bos=bool(bos)))
        if len(out) == count:
            return out
    raise ValueError(
        f"the {corpus!r} corpus has only {len(out)} document(s) of {length} tokens or more outside the "
        f"calibration set; ask for fewer (--docs) or shorter lengths"
    )
