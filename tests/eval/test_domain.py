"""The calibration-domain runs: declared with their corpora, cross-scored on each other's held-out rows as
they are calibrated, and drawn as one section of RESULTS.md."""

from __future__ import annotations

import json

from sgl_ridgefill.eval import results
from sgl_ridgefill.eval.domain import DOMAIN_R2, section
from sgl_ridgefill.eval.results_md import render_results_md
from sgl_ridgefill.eval.tradeoff import PlannedRun

from .test_tradeoff import _meta, _needles, _write

N_RESAMPLES = 300


def _domain_runs():
    return [r for r in results.RUNS if r.group == results.CALIBRATION_DOMAIN]


def test_one_run_per_corpus_each_calibrated_on_its_part(tmp_path):
    runs = _domain_runs()
    assert [r.corpus for r in runs] == list(results.DOMAIN_CORPORA)
    assert len({r.maps_name() for r in runs}) == 3 and len({r.name for r in runs}) == 3
    for run in runs:
        maps = tmp_path / "maps" / run.maps_name()
        (command,) = run.calibrate_commands(maps, tmp_path / "stats" / run.stats_name())
        assert command[command.index("--corpus") + 1] == run.corpus
        assert run.own_stats(maps, tmp_path / "stats") == maps.with_name(maps.name + ".stats")
        eval_command = run.eval_command(maps, tmp_path / run.name)
        assert eval_command[eval_command.index("--haystacks") + 1] == "text,code"


def test_scores_fill_in_as_the_passes_are_made(tmp_path, monkeypatch):
    from sgl_ridgefill.calibration import score as score_module
    from sgl_ridgefill.calibration.stats import STATS_FILE

    calls = []

    def fake_score(maps, stats, *, splits):
        calls.append((maps.name, stats.name))
        return {"splits": {str(splits[0]): {"mean_r2": 0.5 + 0.1 * len(calls), "mean_r2_identity": 0.4,
                                            "heldout_rows": 100}}}

    monkeypatch.setattr(score_module, "score_maps", fake_score)
    mix, code, prose = _domain_runs()

    def calibrated(run):
        maps = tmp_path / "maps" / run.maps_name()
        stats = run.own_stats(maps, tmp_path / "stats" / run.stats_name())
        stats.mkdir(parents=True)
        (stats / STATS_FILE).write_bytes(b"")
        return maps

    out = tmp_path / DOMAIN_R2
    maps = calibrated(mix)
    calibrated(code)
    scores = results.write_domain_scores(mix, maps, tmp_path, out)
    assert set(scores) == {"builtin", "builtin:code"}  # prose not calibrated yet: left for a later run
    calibrated(prose)
    scores = results.write_domain_scores(mix, maps, tmp_path, out)
    assert set(scores) == {"builtin", "builtin:code", "builtin:prose"}
    assert len(calls) == 3 and json.loads(out.read_text()) == scores  # the first two were kept, not redone


def test_the_section_shows_retrieval_per_haystack_and_the_r2_matrix(tmp_path):
    haystack = lambda i: "code" if i % 2 else "text"  # noqa: E731
    _write(tmp_path / "mix", [_meta(12), *_needles({"exact": [100] * 8, "ridgefill": [100, 0] * 4}, haystack=haystack)])
    (tmp_path / "mix" / DOMAIN_R2).write_text(json.dumps({"builtin": {"mean_r2": 0.85, "mean_r2_identity": 0.45},
                                                          "builtin:code": {"mean_r2": 0.8, "mean_r2_identity": 0.4}}))
    runs = [("builtin", PlannedRun("mix", "qwen", "residual", 12, 4096, tmp_path / "mix")),
            ("builtin:code", PlannedRun("code", "qwen", "residual", 12, 4096, tmp_path / "code"))]
    text = "\n\n".join(section(runs, n_resamples=N_RESAMPLES))
    assert "## Calibration domain" in text
    assert "| `builtin` | code | 4 | 100.0 | 0.0 | -100.0 |" in text
    assert "| `builtin` | text | 4 | 100.0 | 100.0 | +0.0 |" in text
    assert "| `builtin` | 0.850 (0.450) | 0.800 (0.400) |" in text and "| `builtin:code` | – | – |" in text
    assert section([], n_resamples=N_RESAMPLES) == []
    out = render_results_md([tmp_path / "mix"], tmp_path / "RESULTS.md", "cmd", domain=runs, n_resamples=N_RESAMPLES)
    assert "## Calibration domain" in out.read_text()
