"""The map kind x split x rows comparison: speed bounds, pairing across runs, "not run" rows, table and plot."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.eval.analysis import summarize
from sgl_ridgefill.eval.results_md import TRADEOFF_PNG, render_results_md
from sgl_ridgefill.eval.tradeoff import NOT_RUN, PlannedRun, cross_run_difference, speed_bound, tradeoff_rows

N_RESAMPLES = 300


def test_speed_bound():
    # At 4K with T = 1024 on 24 layers, r = 0.625 / 0.688 / 0.75 for S = 12 / 14 / 16.
    assert speed_bound(12, 24, 1024, 4096) == pytest.approx(1 / 0.625)
    assert 1 / speed_bound(14, 24, 1024, 4096) == pytest.approx(0.6875)
    assert 1 / speed_bound(16, 24, 1024, 16384) == pytest.approx(2 / 3 + 1 / 3 * 1024 / 16384)
    # 10 % of the prefix rows exact: T + 0.1 (N - T) rows run every layer.
    assert 1 / speed_bound(12, 24, 1024, 4096, 0.1) == pytest.approx(0.5 + 0.5 * (1024 + 307.2) / 4096)
    assert speed_bound(24, 24, 1024, 4096) == 1.0
    with pytest.raises(ValueError, match="split 25 of 24 layers"):
        speed_bound(25, 24, 1024, 4096)


def _meta(split, kind=None, fill_flops=None):
    meta = {"kind": "meta", "model": "qwen", "split": split, "tail": 1024, "num_layers": 24, "rows_fraction": 0.1,
            "lengths": [4096], "preset": "quality"}
    if fill_flops is not None:  # recorded by runs since the fill cost column
        meta["fill_flops_per_row"] = fill_flops
    return meta if kind is None else {**meta, "map_kind": kind}


def _needles(scores, sha=lambda i: f"p{i}", haystack=lambda i: "noise" if i % 2 else "text", exact_rows=None):
    """Filled-region records of samples s0.. with ``scores[arm][i]``; samples s{i} hash to ``sha(i)``; the
    RidgeFill+rows arm reports ``exact_rows`` rows when given."""
    return [{"kind": "needle", "length": 4096, "task": "niah_single", "haystack": haystack(i), "sample": f"s{i}",
             "prompt_sha": sha(i), "arm": arm, "region": "filled", "depth": 0.3, "position": 900, "score": float(v),
             "output": "", "answers": ["1234567"], "seconds": 0.1,
             **({"exact_rows": exact_rows} if exact_rows is not None and arm == "ridgefill+rows" else {})}
            for arm, values in scores.items() for i, v in enumerate(values)]


def _write(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summarize(records, n_resamples=N_RESAMPLES)))
    (folder / "REPORT.md").write_text(f"# {folder.name}\n")


@pytest.fixture
def runs(tmp_path):
    """Residual maps at split 12 (the reference) and 14, kv maps at 12 with two samples of other prompts;
    normalised maps not run."""
    ref = {"exact": [100] * 8, "ridgefill": [100, 0, 0, 0, 100, 0, 100, 0], "ridgefill+rows": [100] * 6 + [0, 0]}
    s14 = {"exact": [100] * 8, "ridgefill": [100, 100, 0, 100, 100, 0, 100, 100], "ridgefill+rows": [100] * 8}
    kv = {"exact": [100] * 8, "ridgefill": [100] * 8}
    _write(tmp_path / "r12", [_meta(12), *_needles(ref)])  # a run written before map kinds: residual
    _write(tmp_path / "r14", [_meta(14, "residual"), *_needles(s14)])
    _write(tmp_path / "kv12", [_meta(12, "kv", 458_752), *_needles(kv, sha=lambda i: "other" if i < 2 else f"p{i}")])
    # kv maps with a selection of their own (--rows-select): no fixed share, 614 rows served (20 % of 3,072).
    lexical = {"exact": [100] * 8, "ridgefill+rows": [100] * 8}
    _write(tmp_path / "kv12-lex", [{**_meta(12, "kv"), "rows_fraction": None, "rows_select": "lexical_net()"},
                                   *_needles(lexical, exact_rows=614)])
    return [PlannedRun("r12", "qwen", "residual", 12, 4096, tmp_path / "r12"),
            PlannedRun("r14", "qwen", "residual", 14, 4096, tmp_path / "r14"),
            PlannedRun("n12", "qwen", "normalised", 12, 4096, tmp_path / "n12"),
            PlannedRun("kv12", "qwen", "kv", 12, 4096, tmp_path / "kv12"),
            PlannedRun("kv12-lex", "qwen", "kv", 12, 4096, tmp_path / "kv12-lex", "lexical_net()"),
            PlannedRun("n12-lex", "qwen", "normalised", 12, 4096, tmp_path / "n12-lex", "digits()")]


def test_rows_pair_runs_by_sample_and_prompt(runs):
    rows = {r["name"]: r for r in tradeoff_rows(runs, n_resamples=N_RESAMPLES)}
    ref, r14, kv = rows["r12"], rows["r14"], rows["kv12"]
    assert (ref["status"], ref["map_kind"], ref["split"], ref["n"]) == ("measured", "residual", "12/24", 8)
    assert ref["retrieval"]["ridgefill"]["mean"] == 37.5 and ref["retrieval"]["ridgefill+rows"]["mean"] == 75.0
    assert ref["vs_exact"]["ridgefill"]["diff"] == -62.5 and ref["vs_reference"] is None
    assert ref["speed"] == pytest.approx(1.6) and ref["speed_rows"] == pytest.approx(speed_bound(12, 24, 1024, 4096, 0.1))
    assert r14["vs_reference"]["n"] == 8 and r14["vs_reference"]["diff"] == pytest.approx(37.5)
    assert (r14["vs_reference"]["b01"], r14["vs_reference"]["b10"], r14["vs_reference"]["other_prompt"]) == (0, 3, 0)
    assert r14["speed"] == pytest.approx(1 / 0.6875)
    # kv: samples s0 and s1 were made with other prompts (other calibration documents left out of the prose).
    assert (kv["vs_reference"]["n"], kv["vs_reference"]["other_prompt"]) == (6, 2)
    assert kv["vs_reference"]["diff"] == pytest.approx(100 - 200 / 6)
    assert kv["retrieval"].get("ridgefill+rows") is None and kv["vs_exact"]["ridgefill+rows"] is None
    assert rows["n12"]["status"] == NOT_RUN and rows["n12"]["split"] == "12"
    assert ref["rows"] == rows["n12"]["rows"] == "attention 10 %"
    lex = rows["kv12-lex"]
    assert lex["rows"] == "`lexical_net()`" and rows["n12-lex"]["rows"] == "`digits()`"  # measured and planned
    assert lex["retrieval"]["ridgefill+rows"]["mean"] == 100.0 and lex["retrieval"].get("ridgefill") is None
    assert lex["speed_rows"] == pytest.approx(speed_bound(12, 24, 1024, 4096, 614 / 3072))  # the rows served
    assert ref["by_haystack"]["text"]["ridgefill"]["mean"] == 75.0  # s0, s2, s4, s6
    assert ref["by_haystack"]["noise"]["ridgefill"]["mean"] == 0.0


def test_cross_run_difference_needs_shared_samples():
    a = summarize(_needles({"ridgefill": [100, 0]}), n_resamples=N_RESAMPLES)
    b = summarize(_needles({"ridgefill": [0, 0]}, sha=lambda i: "x"), n_resamples=N_RESAMPLES)
    assert cross_run_difference(a, b, 4096, "ridgefill") is None  # every prompt differs
    assert cross_run_difference(a, a, 4096, "exact") is None  # an arm neither run scored
    assert cross_run_difference(a, a, 8192, "ridgefill") is None  # another length


def test_results_md_table_plot_and_not_run_rows(tmp_path, runs):
    out = tmp_path / "docs" / "RESULTS.md"
    text = render_results_md([r.report_dir for r in runs if r.report_dir.exists()], out, "x", comparison=runs,
                             n_resamples=N_RESAMPLES).read_text()
    section = text[text.index("## Choosing the split"):text.index("\n## r12")]
    main, per_haystack = section.split("Per haystack")
    cells = lambda line: line.split(" | ")  # noqa: E731
    lines = {"@".join(cells(line)[1:3]) + ("@" + cells(line)[4]).replace("@attention 10 %", ""): line
             for line in main.splitlines() if line.startswith("| qwen |")}
    assert lines["residual@12/24"].startswith(
        "| qwen | residual | 12/24 | 4096 | attention 10 % | 8 | 100.0 [100.0, 100.0] | 37.5 [")
    assert "| -62.5 [" in lines["residual@12/24"] and "| reference | – | – | – | 1.60× | 1.51× |" in lines["residual@12/24"]
    assert "| +37.5 [" in lines["residual@14/24"] and "(n = 8) |" in lines["residual@14/24"]
    assert lines["normalised@12"] == "| qwen | normalised | 12 | 4096 | attention 10 % | not run | – | – | – | – | – | – | – | – | – | – | – |"
    assert lines["normalised@12@`digits()`"].startswith("| qwen | normalised | 12 | 4096 | `digits()` | not run |")
    assert lines["kv@12/24@`lexical_net()`"].startswith("| qwen | kv | 12/24 | 4096 | `lexical_net()` | 8 | 100.0 [")
    assert "(n = 6), 2 with other prompts left out | – | – | 0.46 | 1.60× |" in lines["kv@12/24"]
    assert "| qwen | residual | 12/24 | 4096 | attention 10 % | text | 4 | 100.0 [100.0, 100.0] | 75.0 [" in per_haystack
    assert f"]({TRADEOFF_PNG})" in section and (out.parent / TRADEOFF_PNG).stat().st_size > 1000
    # No comparison: no section, no plot left behind.
    text = render_results_md([runs[0].report_dir], out, "x").read_text()
    assert "Choosing the split" not in text and not (out.parent / TRADEOFF_PNG).exists()


def test_key_token_excess_with_and_without_rows(tmp_path):
    folder = tmp_path / "kvc12"
    folder.mkdir()
    diff = lambda arm, d: {"length": 4096, "metric": "key", "arm": arm, "vs": "exact", "n": 4,  # noqa: E731
                           "diff": d, "low": d - 0.2, "high": d + 0.2}
    summary = {"meta": _meta(12, "kv+context"), "retrieval": [], "retrieval_diffs": [], "samples": [],
               "loss_diffs": [diff("ridgefill", 0.889), diff("ridgefill+rows", 0.512), diff("ridgefill", 0.1) | {"vs": "identity"}]}
    (folder / "summary.json").write_text(json.dumps(summary))
    (row,) = tradeoff_rows([PlannedRun("kvc12", "qwen", "kv+context", 12, 4096, folder)], n_resamples=N_RESAMPLES)
    assert (row["key_excess"]["diff"], row["key_excess_rows"]["diff"]) == (0.889, 0.512)


def test_a_run_of_other_needle_tasks_names_them(tmp_path):
    """The table compares runs on the same prompts; a run of other tasks says which, beside its sample count."""
    scores = {"exact": [100] * 4, "ridgefill+rows": [100] * 4}
    _write(tmp_path / "ref", [{**_meta(12), "tasks": ["niah_single", "niah_multikey"]}, *_needles(scores)])
    _write(tmp_path / "fresh", [{**_meta(12), "tasks": ["niah_multivalue", "niah_multiquery"]},
                                *_needles(scores, sha=lambda i: f"q{i}")])
    planned = [PlannedRun("ref", "qwen", "residual", 12, 4096, tmp_path / "ref"),
               PlannedRun("fresh", "qwen", "residual", 12, 4096, tmp_path / "fresh")]
    rows = {r["name"]: r for r in tradeoff_rows(planned, n_resamples=N_RESAMPLES)}
    assert rows["ref"]["other_tasks"] is None and rows["fresh"]["other_tasks"] == ("niah_multivalue", "niah_multiquery")
    from sgl_ridgefill.eval.tradeoff import tradeoff_table

    text = tradeoff_table(list(rows.values()))
    assert "| 4 (niah_multivalue, niah_multiquery) |" in text and "| 4 |" in text
