"""``python -m sgl_ridgefill.eval.results --report-only``: reports rewritten from raw results, then joined."""

from __future__ import annotations

import json

from sgl_ridgefill.eval import results
from tests.eval.test_analysis import CHECK, META, _document_records, _needle_records


def test_report_only_rewrites_reports_from_raw_results_and_joins_them(tmp_path, capsys):
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    first, second = results.RUNS[0].name, results.RUNS[1].name
    (runs / first).mkdir(parents=True)
    records = [META, CHECK, *_needle_records(), *_document_records()]
    (runs / first / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    assert results.main(["--runs-dir", str(runs), "--docs", str(docs), "--only", f"{first},{second}",
                         "--report-only"]) == 0
    assert f"{second}: no results" in capsys.readouterr().out
    report = docs / "results" / first / "REPORT.md"
    assert "byte-identical" in report.read_text()
    assert (docs / "results" / first / "summary.json").exists() and not (docs / "results" / second).exists()
    assert f"results/{first}/" in (docs / "RESULTS.md").read_text()
    assert not (runs / "maps").exists()  # nothing fitted, no server started
