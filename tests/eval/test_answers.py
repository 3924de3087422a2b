"""Reading wrong answers to numeric needles: near misses, other keys' values and misses."""

from __future__ import annotations

import pytest

from sgl_ridgefill.eval.analysis import summarize
from sgl_ridgefill.eval.answers import DISTRACTOR, MISS, NEAR, is_numeric, lcs_length, near_miss_examples, read_answer
from sgl_ridgefill.eval.report import write_report


def test_lcs_length():
    assert lcs_length("1234567", "1234567") == 7
    assert lcs_length("1234568", "1234567") == 6
    assert lcs_length("123567", "1234567") == 6
    assert lcs_length("7654321", "1234567") == 1
    assert lcs_length("", "123") == 0


@pytest.mark.parametrize("output, reading", [
    (" 1234567.", None),  # right
    (" 1234568.", NEAR),  # the last digit changed
    (" 1243567.", NEAR),  # two digits swapped: 6 of 7 in order
    (" 123567.", NEAR),  # a digit dropped
    (" 12345067.", NEAR),  # a digit added
    (" 12367.", NEAR),  # 5 of 7 in order
    (" 12399.", MISS),  # 3 of 7
    (" 1299999.", MISS),  # 2 of 7
    (" 9876543.", MISS),  # another number
    (" the grass is green.", MISS),  # no number
    ("", MISS),
    (" 1203405060708090.", MISS),  # a run too long to be a garbled value (it would match anything)
])
def test_read_answer(output, reading):
    assert read_answer(output, ["1234567"]) == reading


def test_several_values_and_non_numeric_tasks():
    # Multivalue: one value found, the other garbled; a run equal to an expected value is not a candidate.
    assert read_answer(" 1234567, 7654320", ["1234567", "7654321"]) == NEAR
    assert read_answer(" 1234567 and nothing else", ["1234567", "7654321"]) == MISS
    assert read_answer(" 1234567, 7654321", ["1234567", "7654321"]) is None
    assert not is_numeric(["ABCDE", "FGHIJ"]) and not is_numeric(["apple"]) and not is_numeric([])
    assert read_answer(" XYZ", ["ABCDE"]) is None  # vt, cwe: not read


def test_another_keys_value():
    """A multikey answer that is one of the prompt's other keys' values found the wrong needle; a value copied
    wrongly from the right needle stays a near miss even beside it."""
    others = ["5515483", "1234500"]
    assert read_answer(" 5515483.", ["5725678"], others) == DISTRACTOR
    assert read_answer(" 5515483.", ["5725678"]) == MISS  # the other values unknown (older records)
    assert read_answer(" 5515483.", ["5725678"], []) == MISS
    # 1234500 holds 5 of 1234567's digits in order, but it is another key's value, not a garbled copy.
    assert read_answer(" 1234500.", ["1234567"], others) == DISTRACTOR
    assert read_answer(" 1234500.", ["1234567"]) == NEAR
    assert read_answer(" 1234568 or 5515483", ["1234567"], others) == NEAR
    assert read_answer(" 1234567.", ["1234567"], others) is None


def _needle(sample, arm, score, output, haystack="noise", region="filled", answers=("1234567",), others=None):
    record = {"kind": "needle", "length": 4096, "task": "niah_single", "haystack": haystack, "sample": sample,
              "arm": arm, "region": region, "depth": 0.3, "position": 1200, "score": score, "output": output,
              "answers": list(answers), "seconds": 0.1}
    if others is not None:
        record["distractor_answers"] = list(others)
    return record


RECORDS = [
    _needle("s0", "ridgefill", 0.0, " 1234568."),
    _needle("s1", "ridgefill", 0.0, " 1234500."),
    _needle("s2", "ridgefill", 0.0, " 5550001.", haystack="text"),
    _needle("s3", "ridgefill", 100.0, " 1234567."),
    _needle("s4", "ridgefill", 0.0, " 1234560.", region="tail"),  # tail: not read
    _needle("s5", "ridgefill", 0.0, " VWXYZ", answers=("ABCDE",)),  # not numeric: not read
    *(_needle(f"s{i}", "exact", 100.0, " 1234567.") for i in range(4)),
]


def test_share_of_near_misses_per_arm_and_haystack(tmp_path):
    summary = summarize(RECORDS, n_resamples=200)
    rows = {(r["haystack"], r["arm"]): r for r in summary["near_misses"]}
    rf = rows[("all", "ridgefill")]
    assert (rf["n"], rf["wrong"], rf["near"]) == (4, 3, 2) and rf["share"] == pytest.approx(200 / 3)
    assert rf["low"] <= rf["share"] <= rf["high"]
    assert (rows[("noise", "ridgefill")]["wrong"], rows[("noise", "ridgefill")]["near"]) == (2, 2)
    assert (rows[("text", "ridgefill")]["near"], rows[("text", "ridgefill")]["share"]) == (0, 0.0)
    exact = rows[("all", "exact")]
    assert (exact["wrong"], exact["share"], exact["low"]) == (0, None, None)
    examples = summary["near_miss_examples"]
    assert [(e["sample"], e["reading"]) for e in examples] == [("s0", NEAR), ("s1", NEAR), ("s2", MISS)]
    assert near_miss_examples(RECORDS, per_arm=1)[0]["output"] == "1234568."

    text = write_report(summary, tmp_path, title="t").read_text()
    section = text[text.index("## Wrong answers to numeric needles"):text.index("## Loss")]
    assert "| 4096 | all | ridgefill | 4 | 3 | 2 | 67 % [" in section
    assert "| 4096 | all | exact | 4 | 0 | 0 | no wrong answer |" in section
    assert "| ridgefill | s0 | 1234567 | `1234568.` | near miss |" in section
    assert "2 of 3 are near misses" in text.split("## What the numbers say")[1]


def test_wrong_answers_that_are_another_keys_value(tmp_path):
    """Counted per arm where every wrong answer's record knows the other keys' values; a column and a reading
    in the report only then."""
    records = [
        _needle("m0", "ridgefill", 0.0, " 5515483.", others=("5515483", "7000001")),
        _needle("m1", "ridgefill", 0.0, " 1234568.", others=("5515483", "7000001")),
        _needle("m2", "ridgefill", 0.0, " 9999999.", others=("5515483", "7000001")),
        _needle("m3", "ridgefill", 100.0, " 1234567.", others=("5515483", "7000001")),
        _needle("m0", "exact", 0.0, " 7000001.", haystack="text", others=("5515483", "7000001")),
        _needle("m1", "exact", 0.0, " 5515483."),  # an older record: its other values unknown
    ]
    summary = summarize(records, n_resamples=200)
    rows = {(r["haystack"], r["arm"]): r for r in summary["near_misses"]}
    assert (rows[("all", "ridgefill")]["wrong"], rows[("all", "ridgefill")]["near"],
            rows[("all", "ridgefill")]["distractor"]) == (3, 1, 1)
    assert rows[("all", "exact")]["distractor"] is None and rows[("text", "exact")]["distractor"] == 1
    assert [(e["sample"], e["reading"]) for e in summary["near_miss_examples"] if e["arm"] == "ridgefill"] == [
        ("m1", NEAR), ("m0", DISTRACTOR), ("m2", MISS)]

    text = write_report(summary, tmp_path, title="t").read_text()
    section = text[text.index("## Wrong answers to numeric needles"):text.index("## Loss")]
    assert "| length | haystack | arm | samples | wrong | near misses | another key's value |" in section
    assert "| 4096 | all | ridgefill | 4 | 3 | 1 | 1 | 33 % [" in section
    assert "| 4096 | all | exact | 2 | 2 | 0 | – | 0 % " in section
    assert "| ridgefill | m0 | 1234567 | `5515483.` | another key's value |" in section
    assert "1 of 3 are near misses" in text and "1 of 3 another key's value" in text
    # Without any record that knows its other values, the table keeps its old columns.
    plain = write_report(summarize(RECORDS, n_resamples=200), tmp_path / "plain", title="t").read_text()
    assert "another key's value" not in plain
