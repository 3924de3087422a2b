"""``calibrate score``: a maps folder scored on another pass's held-out statistics, with the calibration's own
arithmetic (its own statistics give back the R² calibration reported, up to the stored maps' bf16)."""

from __future__ import annotations

import argparse
import json

import pytest

from sgl_ridgefill.calibration import cli as calibration_cli
from sgl_ridgefill.calibration.config import CalibrationError
from sgl_ridgefill.calibration.pipeline import calibrate, collect_stats
from sgl_ridgefill.calibration.score import score_maps
from sgl_ridgefill.maps import load_maps

from .test_pipeline import _config  # the tiny pass over splits 1 and 2


@pytest.fixture(scope="module")
def fitted(tiny_model, text_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("score") / "maps"
    return calibrate(_config(tiny_model, text_corpus, out), log=lambda m: None)


def test_own_statistics_give_back_the_reported_scores(fitted):
    result = score_maps(fitted.out_dir, fitted.stats_dir)
    manifest = load_maps(fitted.out_dir).manifest
    assert result["map_kind"] == "residual" and set(result["splits"]) == {"1", "2"}
    for split, scores in result["splits"].items():
        reported = manifest["splits"][split]["heldout"]
        assert scores["mean_r2"] == pytest.approx(reported["mean_r2"], abs=2e-3)  # bf16 maps against float64
        assert scores["mean_r2_identity"] == pytest.approx(reported["mean_r2_identity"], abs=1e-5)  # rounded to 5 places
        assert scores["heldout_rows"] == reported["rows"] and len(scores["r2"]) == len(scores["layers"])


def test_another_pass_scores_the_same_maps_differently(fitted, tiny_model, text_corpus, tmp_path):
    other, _, _ = collect_stats(_config(tiny_model, text_corpus, None, stats_dir=tmp_path / "other.stats", seed=7,
                                        heldout_docs=1), log=lambda m: None)
    result = score_maps(fitted.out_dir, tmp_path / "other.stats", splits=(2,))
    own = score_maps(fitted.out_dir, fitted.stats_dir, splits=(2,))
    assert set(result["splits"]) == {"2"}
    assert result["splits"]["2"]["heldout_rows"] != own["splits"]["2"]["heldout_rows"] or \
        result["splits"]["2"]["r2"] != own["splits"]["2"]["r2"]


def test_what_does_not_match_is_named(fitted, tmp_path):
    with pytest.raises(CalibrationError, match=r"split\(s\) 3: the maps hold 1, 2"):
        score_maps(fitted.out_dir, fitted.stats_dir, splits=(3,))
    with pytest.raises(CalibrationError, match="no stats.json there|not a calibration stats folder"):
        score_maps(fitted.out_dir, tmp_path)


def test_the_command_prints_and_writes(fitted, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    calibration_cli.add_subparser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "score.json"
    args = parser.parse_args(["calibrate", "score", "--maps", str(fitted.out_dir), "--stats", str(fitted.stats_dir),
                              "--json", str(out)])
    assert args.func(args) == 0
    assert "| layer | R² | R² identity |" in capsys.readouterr().out
    assert set(json.loads(out.read_text())["splits"]) == {"1", "2"}
    args = parser.parse_args(["calibrate", "score", "--maps", str(fitted.out_dir), "--stats", str(tmp_path)])
    assert args.func(args) == 1
    assert "sgl-ridgefill calibrate: error:" in capsys.readouterr().err
