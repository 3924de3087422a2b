"""Reuse the exact arm across runs on the same prompts (``sgl-ridgefill eval --exact-from DIR``).

The exact arm runs the full model, so its answer to a prompt does not depend on the maps folder, the map kind
or the split: runs that differ only by those (the map kind x split table) need it once. A record is copied
only when it is provably the same request: the same model folder and dtype, the needle sample's prompt hash
equal to this run's, a loss document's token ids equal and, for loss scores (taken over the last T tokens),
the same tail. Copied records carry ``copied_from``; whatever does not match runs as usual.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Mapping, Sequence

from . import arms as A
from .analysis import load_records, meta_record
from .runner import RECORDS, EvalPlan, ResultStore, exact_scores, prompt_sha, record_doc

_SAME_SERVER = ("model_path", "dtype")  # meta settings the exact arm's answers depend on


def source_dtype(sources: Iterable[pathlib.Path]) -> str | None:
    """The dtype the runs in ``sources`` were measured in, when those that exist agree on one (a run that reuses
    their exact arm is measured in it: records of another dtype are not reused)."""
    found = set()
    for source in sources:
        path = pathlib.Path(source) / RECORDS
        if path.exists():
            found.add(meta_record(load_records(path)).get("dtype"))
    return found.pop() if len(found) == 1 else None


def import_exact(store: ResultStore, sources: Iterable[pathlib.Path], meta: Mapping, samples: Sequence,
                 docs: Mapping[int, Sequence], plan: EvalPlan) -> dict[str, int]:
    """Append to ``store`` the exact-arm records of ``sources`` (run folders) that answer this run's
    ``samples`` and ``docs`` (``meta``: this run's meta record); returns how many of each kind it copied."""
    from .metrics import TokenScores

    wanted_needles = {(s.length, s.task, s.id): s for s in samples}
    wanted_docs = {(len(d.prompt_ids), d.id): d for ds in docs.values() for d in ds}
    copied = {"needle": 0, "loss": 0}
    for source in sources:
        path = pathlib.Path(source) / RECORDS
        if path.resolve() == store.path.resolve():
            continue
        if not path.exists():
            raise FileNotFoundError(f"--exact-from {source}: no results.jsonl there")
        records = load_records(path)
        theirs = meta_record(records)
        differ = [k for k in _SAME_SERVER if theirs.get(k) != meta.get(k)]
        if differ:
            print(f"--exact-from {source}: not reused, its {', '.join(differ)} differ from this run's", flush=True)
            continue
        same_tail = theirs.get("tail") == plan.tail
        doc_ids = {(r["length"], r["doc"]): tuple(r["prompt_ids"]) for r in records if r.get("kind") == "doc"}
        for rec in records:
            if rec.get("kind") == "needle" and rec.get("arm") == A.EXACT:
                sample = wanted_needles.get((rec.get("length"), rec.get("task"), rec.get("sample")))
                if sample is None or rec.get("prompt_sha") != prompt_sha(sample.input_ids) or store.has(**rec):
                    continue
                store.add({**rec, "region": sample.region, "depth": sample.depth,
                           "position": sample.needle_spans[0][0], "copied_from": str(source)})
                copied["needle"] += 1
            elif rec.get("kind") == "loss" and rec.get("arm") in (A.EXACT, A.CUT) and same_tail:
                doc = wanted_docs.get((rec.get("length"), rec.get("doc")))
                if doc is None or doc_ids.get((rec["length"], rec["doc"])) != tuple(doc.prompt_ids) or store.has(**rec):
                    continue
                record_doc(store, doc)
                store.add({**rec, "copied_from": str(source)})
                if rec["arm"] == A.EXACT:  # the runner's did-it-fill check compares other arms with it
                    exact_scores[(rec["length"], doc.id)] = TokenScores.from_json(rec["scores"]).logprobs
                copied["loss"] += 1
    return copied
