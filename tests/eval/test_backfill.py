"""Giving records written before ``distractor_answers`` existed the prompt's other values, from the prompt made again."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.eval.backfill import backfill_file
from sgl_ridgefill.eval.needles import make_samples
from sgl_ridgefill.eval.runner import prompt_sha

META = {"kind": "meta", "tasks": ["niah_single", "niah_multikey"], "lengths": [2048], "tail": 512,
        "haystacks": ["noise"], "seeds": 1, "depths": 2}


def _needle(sample, arm, sha, **extra):
    return {"kind": "needle", "length": 2048, "task": sample.task, "haystack": "noise", "sample": sample.id,
            "prompt_sha": sha, "arm": arm, "region": sample.region, "score": 0.0, "output": " 1.",
            "answers": list(sample.answers), "seconds": 1.0, **extra}


def test_records_get_the_values_of_the_prompt_made_again_and_only_of_it(tok, tmp_path):
    samples = make_samples(tok, META["tasks"], META["lengths"], META["tail"], haystacks=("noise",), seeds=(0,), n_filled=2)
    multikey = next(s for s in samples if s.task == "niah_multikey")
    single = next(s for s in samples if s.task == "niah_single")
    sha = prompt_sha(multikey.input_ids)
    records = [META, _needle(multikey, "exact", sha), _needle(single, "exact", prompt_sha(single.input_ids)),
               _needle(multikey, "ridgefill", "0" * 16),  # another prompt under this id: left alone
               _needle(multikey, "ridgefill+rows", sha, distractor_answers=["1"]),  # already has them
               {"kind": "session", "seconds": 3.0}]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))

    done = backfill_file(path, tokenizer=tok, exclude_ids=frozenset())
    assert (done.added, done.present, done.unmatched) == (2, 1, (f"{multikey.id} (ridgefill)",))
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert out[1]["distractor_answers"] == list(multikey.distractor_answers) and len(multikey.distractor_answers) == 3
    assert list(out[1]) == [*list(records[1])[:list(records[1]).index("answers") + 1], "distractor_answers",
                            *list(records[1])[list(records[1]).index("answers") + 1:]]
    assert out[2]["distractor_answers"] == []
    assert "distractor_answers" not in out[3] and out[4]["distractor_answers"] == ["1"]
    assert out[0] == META and out[5] == records[5]
    # Run again: nothing left to add, the file untouched.
    before = path.read_text()
    assert backfill_file(path, tokenizer=tok, exclude_ids=frozenset()).added == 0 and path.read_text() == before


def test_a_run_whose_prompts_cannot_be_made_again_says_why(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"kind": "needle", "sample": "x"}) + "\n")
    with pytest.raises(SystemExit, match="no meta record"):
        backfill_file(path)
    path.write_text(json.dumps({**META, "model": "m", "model_path": str(tmp_path / "none")}) + "\n")
    with pytest.raises(SystemExit, match="tokenizer is not at .*model fetch"):
        backfill_file(path)
    with pytest.raises(SystemExit, match="maps .* are not here"):
        backfill_file(path, tokenizer=object())
