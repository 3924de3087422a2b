"""``sgl-ridgefill eval --exact-from``: the exact arm's records reused only where they answer the same request."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sgl_ridgefill.eval import arms as A
from sgl_ridgefill.eval import runner
from sgl_ridgefill.eval.documents import LongDocument
from sgl_ridgefill.eval.metrics import TokenScores
from sgl_ridgefill.eval.needles import NeedleSample
from sgl_ridgefill.eval.runner import EvalPlan, ResultStore, prompt_sha
from sgl_ridgefill.eval.shared_exact import import_exact

META = {"kind": "meta", "model_path": "/models/m", "dtype": "bfloat16", "tail": 16}
PLAN = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=(A.EXACT, A.RIDGEFILL), loss_arms=(A.EXACT,),
                longtail={64: 20})


def _sample(name: str, ids: tuple[int, ...], region: str = "filled") -> NeedleSample:
    return NeedleSample(f"niah_single/noise/64/0/{name}", "niah_single", "noise", 64, ids, ("1234567",), ((10, 14),),
                        10 / 64, region, 32)


def _scores(value: float) -> dict:
    n = 16
    return TokenScores(48, np.arange(n), np.full(n, value), np.zeros((n, 2), dtype=np.int64),
                       np.zeros((n, 2))).to_json()


def _source(tmp_path, samples, doc, *, meta=META, doc_ids=None):
    folder = tmp_path / "source"
    folder.mkdir()
    store = ResultStore(folder / "results.jsonl")
    store.add(dict(meta))
    for s in samples:
        for arm in (A.EXACT, A.RIDGEFILL):
            store.add({"kind": "needle", "length": 64, "task": s.task, "sample": s.id, "arm": arm,
                       "prompt_sha": prompt_sha(s.input_ids), "region": "tail", "score": 100.0, "output": arm})
    store.add({"kind": "doc", "length": 64, "doc": doc.id, "source": "x", "prompt_ids": list(doc_ids or doc.prompt_ids)})
    for arm, value in ((A.EXACT, -1.0), (A.CUT, -2.0), (A.RIDGEFILL, -3.0)):
        store.add({"kind": "loss", "length": 64, "doc": doc.id, "arm": arm, "scores": _scores(value)})
    return folder


def _records(store):
    return [json.loads(line) for line in store.path.read_text().splitlines()]


def test_copies_the_exact_arm_of_the_same_prompts_and_runs_the_rest(tmp_path):
    same, changed = _sample("0", tuple(range(64))), _sample("1", tuple(range(64)))
    doc = LongDocument("d0", "x", tuple(range(100, 164)))
    source = _source(tmp_path, [same, _sample("1", tuple(range(1, 65)))], doc)
    store = ResultStore(tmp_path / "run" / "results.jsonl")
    store.path.parent.mkdir()
    runner.exact_scores.clear()
    copied = import_exact(store, [source], META, [same, changed], {64: [doc]}, PLAN)
    assert copied == {"needle": 1, "loss": 2}
    got = _records(store)
    needle = next(r for r in got if r["kind"] == "needle")
    # Only the exact arm; the record takes this run's region (the source's tail may differ) and says where from.
    assert (needle["sample"], needle["arm"], needle["region"], needle["copied_from"]) == (same.id, A.EXACT, "filled",
                                                                                        str(source))
    assert sorted(r["arm"] for r in got if r["kind"] == "loss") == [A.CUT, A.EXACT]
    assert [r["kind"] for r in got].count("doc") == 1
    np.testing.assert_array_equal(runner.exact_scores[(64, "d0")], np.full(16, -1.0))
    # What was not copied runs: the changed prompt's exact arm and every RidgeFill arm.
    assert [(s.id, a) for s, a in runner.needle_jobs(store, [same, changed], PLAN)] == [
        (same.id, A.RIDGEFILL), (changed.id, A.EXACT), (changed.id, A.RIDGEFILL)]
    assert list(runner.loss_jobs(store, {64: [doc]}, PLAN)) == []
    # Importing again adds nothing.
    again = ResultStore(store.path)
    assert import_exact(again, [source], META, [same, changed], {64: [doc]}, PLAN) == {"needle": 0, "loss": 0}
    assert len(_records(again)) == len(got)


@pytest.mark.parametrize("change", ["dtype", "model_path", "tail", "doc"])
def test_copies_nothing_that_could_differ(tmp_path, change):
    sample = _sample("0", tuple(range(64)))
    doc = LongDocument("d0", "x", tuple(range(100, 164)))
    meta = {**META, change: "float32" if change == "dtype" else 8 if change == "tail" else "/models/other"}
    source = _source(tmp_path, [sample], doc, meta=META if change == "doc" else meta,
                     doc_ids=tuple(range(200, 264)) if change == "doc" else None)
    store = ResultStore(tmp_path / "results.jsonl")
    copied = import_exact(store, [source], META, [sample], {64: [doc]}, PLAN)
    # Needle answers do not depend on the tail or the loss documents; loss scores do.
    needles = 1 if change in ("tail", "doc") else 0
    assert copied == {"needle": needles, "loss": 0}


def test_a_missing_source_is_an_error(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    with pytest.raises(FileNotFoundError, match="--exact-from .*nowhere: no results.jsonl there"):
        import_exact(store, [tmp_path / "nowhere"], META, [], {}, PLAN)
