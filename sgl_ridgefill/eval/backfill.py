"""Adding the other keys' values to needle records written before runs recorded them.

A multikey wrong answer reads as *another key's value* only when its record lists the prompt's other values
(``distractor_answers``, :mod:`.answers`). Runs written before records carried them can get them afterwards:
the prompts are made again from the run's own settings (its model's tokenizer, its maps' calibration
documents left out of the haystacks) and a record gets the values only when the prompt made again hashes to
the record's ``prompt_sha``, so a record is never given another prompt's values. Nothing measured changes.

    python -m sgl_ridgefill.eval.backfill docs/results/RUN/results.jsonl [...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

FIELD = "distractor_answers"


@dataclasses.dataclass(frozen=True)
class Backfilled:
    """What :func:`backfill_records` did: records given the values, records that already had them, and
    records whose prompt could not be made again (no sample of that id, or another prompt hash)."""

    added: int
    present: int
    unmatched: tuple[str, ...]


def prompts_of(meta: dict[str, Any], tokenizer: Any, exclude_ids: frozenset[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per sample id, the prompt hash and the other keys' values of the needle prompts the run ``meta`` made."""
    from .needles import make_samples
    from .runner import prompt_sha

    samples = make_samples(tokenizer, meta["tasks"], meta["lengths"], meta["tail"], haystacks=meta["haystacks"],
                           seeds=tuple(range(meta["seeds"])), n_filled=meta["depths"], exclude_ids=exclude_ids)
    return {s.id: (prompt_sha(s.input_ids), s.distractor_answers) for s in samples}


def backfill_records(records: Sequence[dict[str, Any]], prompts: dict[str, tuple[str, tuple[str, ...]]]) -> tuple[list[dict[str, Any]], Backfilled]:
    """``records`` with ``distractor_answers`` added to each needle record whose sample's prompt hash matches
    ``prompts``; key order kept, the field placed after ``answers``."""
    out, added, present, unmatched = [], 0, 0, []
    for r in records:
        if r.get("kind") != "needle":
            out.append(r)
            continue
        if FIELD in r:
            present += 1
            out.append(r)
            continue
        made = prompts.get(r.get("sample"))
        if made is None or made[0] != r.get("prompt_sha"):
            unmatched.append(f"{r.get('sample')} ({r.get('arm')})")
            out.append(r)
            continue
        new: dict[str, Any] = {}
        for k, v in r.items():
            new[k] = v
            if k == "answers":
                new[FIELD] = list(made[1])
        new.setdefault(FIELD, list(made[1]))
        out.append(new)
        added += 1
    return out, Backfilled(added, present, tuple(unmatched))


def backfill_file(path: pathlib.Path, *, tokenizer: Any = None, exclude_ids: frozenset[str] | None = None) -> Backfilled:
    """Backfill one ``results.jsonl`` in place (written whole, then renamed over the old file).

    ``tokenizer`` and ``exclude_ids`` default to the run's own: the tokenizer at its meta's ``model_path`` and
    the calibration documents listed by its ``maps`` manifest. Raises ``SystemExit`` naming what is missing.
    """
    from .analysis import load_records
    from .documents import calibration_ids

    records = load_records(path)
    meta = next((r for r in records if r.get("kind") == "meta"), None)
    if meta is None:
        raise SystemExit(f"sgl-ridgefill eval backfill: {path} has no meta record; it is not an eval run's results")
    if tokenizer is None:
        model = pathlib.Path(meta.get("model_path") or "")
        if not (model / "tokenizer_config.json").exists() and not (model / "tokenizer.json").exists():
            raise SystemExit(f"sgl-ridgefill eval backfill: {path}: the run's tokenizer is not at {model}; fetch the "
                             f"model ({meta.get('model')}) with `sgl-ridgefill model fetch`")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    if exclude_ids is None:
        maps = meta.get("maps")
        if maps is None or not (pathlib.Path(maps) / "manifest.json").exists():
            raise SystemExit(f"sgl-ridgefill eval backfill: {path}: the run's maps ({maps}) are not here; its "
                             "haystacks left their calibration documents out, so its prompts cannot be made again")
        exclude_ids = calibration_ids(maps)
    out, done = backfill_records(records, prompts_of(meta, tokenizer, exclude_ids))
    if done.added:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in out))
        os.replace(tmp, path)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_ridgefill.eval.backfill", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=pathlib.Path, help="results.jsonl files of eval runs")
    args = parser.parse_args(argv)
    for path in args.results:
        done = backfill_file(path)
        print(f"{path}: added to {done.added} needle record(s), {done.present} had them, "
              f"{len(done.unmatched)} not made again" + (f" (first: {done.unmatched[0]})" if done.unmatched else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
