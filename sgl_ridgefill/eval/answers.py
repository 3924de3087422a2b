"""Reading the wrong answers to numeric needles: near misses, other keys' values and misses.

The niah needles' values are 7-digit numbers. A wrong answer that holds at least :data:`NEAR_DIGITS` of an
expected value's 7 digits in order (longest common subsequence; one changed, dropped or added digit is
always one) is a *near miss*: the model found the needle but copied its digits wrongly, an error in the
needle rows' own keys and values. One that gives the value of another key's needle in the prompt (multikey's
distractors, when the record lists them as ``distractor_answers``) found the wrong needle: *another key's
value*, an error in telling the keys apart. Anything else is a *miss*: no number, or an invented one, an
error in finding the needle among the haystack's keys. The seed paper saw 13 of 17 misses differ only in
the last digit.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .arms import arm_sort_key
from .retrieval import ALL, SUCCESS, haystack_of
from .stats import bootstrap_mean, interval_fields

NEAR, DISTRACTOR, MISS = "near miss", "another key's value", "miss"
_READING_ORDER = {NEAR: 0, DISTRACTOR: 1, MISS: 2}
VALUE_DIGITS = 7
NEAR_DIGITS = 5
EXAMPLES_PER_ARM = 3
_NUMBER = re.compile(r"\d+")
_VALUE = re.compile(rf"\d{{{VALUE_DIGITS}}}")
# Digit runs this long can be a garbled 7-digit value; longer ones would match any value by chance.
_CANDIDATE_LENGTHS = range(NEAR_DIGITS, 2 * VALUE_DIGITS - NEAR_DIGITS + 1)


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of ``a`` and ``b``."""
    previous = [0] * (len(b) + 1)
    for ca in a:
        current = [0]
        for j, cb in enumerate(b):
            current.append(previous[j] + 1 if ca == cb else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def is_numeric(answers: Sequence[str]) -> bool:
    """Whether every expected answer is a 7-digit needle value (the niah tasks)."""
    return bool(answers) and all(_VALUE.fullmatch(a) for a in answers)


def read_answer(output: str, answers: Sequence[str], others: Sequence[str] | None = None) -> str | None:
    """:data:`NEAR`, :data:`DISTRACTOR` or :data:`MISS` for an answer that misses an expected value; None when
    every value is in ``output`` (RULER's match) or the answers are not numeric.

    ``others``: the values of the prompt's other keys' needles (None or empty: unknown or none, so no answer
    reads as :data:`DISTRACTOR`). A digit run equal to one of them is that value, never a garbled copy of an
    expected one; a near miss elsewhere in the answer still reads as :data:`NEAR`.
    """
    if not is_numeric(answers):
        return None
    missing = [a for a in answers if a not in output]
    if not missing:
        return None
    others = set(others or ())
    runs = [r for r in _NUMBER.findall(output) if len(r) in _CANDIDATE_LENGTHS and r not in answers]
    if any(lcs_length(run, value) >= NEAR_DIGITS for run in runs if run not in others for value in missing):
        return NEAR
    return DISTRACTOR if any(run in others for run in runs) else MISS


def _reading(record: Mapping[str, Any]) -> str | None:
    return read_answer(str(record.get("output") or ""), record.get("answers") or (), record.get("distractor_answers"))


def near_miss_rows(needles: Sequence[Mapping[str, Any]], n_resamples: int) -> list[dict[str, Any]]:
    """Filled-region samples of numeric needles per length, arm and haystack (``"all"`` pools them):
    {length, haystack, arm, n (numeric samples), wrong, near, distractor (wrong answers that are another key's
    value; None unless every record of the group lists the other values), share (near misses among wrong
    answers, 0-100), low, high (95% BCa interval of the share; None without wrong answers)}."""
    readings: dict[tuple, list[tuple[str | None, bool]]] = defaultdict(list)
    for r in needles:
        if r["region"] == "filled" and is_numeric(r.get("answers") or ()):
            reading = _reading(r) if float(r["score"]) < SUCCESS else None
            for haystack in (ALL, haystack_of(r)):
                readings[(r["length"], haystack, r["arm"])].append((reading, "distractor_answers" in r))
    rows = []
    for (length, haystack, arm), values in sorted(readings.items(), key=lambda kv: _order(kv[0])):
        wrong = [v for v, _ in values if v is not None]
        known = all(k for _, k in values)
        near = sum(v == NEAR for v in wrong)
        row = {"length": length, "haystack": haystack, "arm": arm, "n": len(values), "wrong": len(wrong), "near": near,
               "distractor": sum(v == DISTRACTOR for v in wrong) if known else None,
               "share": None, "low": None, "high": None}
        if wrong:
            row.update(interval_fields(bootstrap_mean(100.0 * np.array([v == NEAR for v in wrong]),
                                                      n_resamples=n_resamples), "share"))
        rows.append(row)
    return rows


def _order(key: tuple) -> tuple:
    length, haystack, arm = key
    return (length, haystack != ALL, haystack, arm_sort_key(arm))


def near_miss_examples(needles: Sequence[Mapping[str, Any]], per_arm: int = EXAMPLES_PER_ARM) -> list[dict[str, Any]]:
    """A few wrong filled-region answers per arm, near misses first, then other keys' values: {arm, sample,
    haystack, expected, output, reading}; ``output`` is cut to 80 characters."""
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in needles:
        if r["region"] != "filled" or float(r["score"]) >= SUCCESS:
            continue
        reading = _reading(r)
        if reading is not None:
            output = " ".join(str(r.get("output") or "").split()).replace("`", "'")  # shown as Markdown code
            by_arm[r["arm"]].append({"arm": r["arm"], "sample": r["sample"], "haystack": haystack_of(r),
                                     "expected": ", ".join(r["answers"]), "output": output[:80], "reading": reading})
    out = []
    for arm in sorted(by_arm, key=arm_sort_key):
        out += sorted(by_arm[arm], key=lambda e: (_READING_ORDER[e["reading"]], e["sample"]))[:per_arm]
    return out
