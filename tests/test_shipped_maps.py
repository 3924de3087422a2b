"""The maps shipped for the demo's model: installed with the package, intact (sha256 of every file), fitted
as the demo would fit them, and checked against the converted model before use."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from sgl_ridgefill.maps import load_maps
from sgl_ridgefill.models import cached_model_dir
from sgl_ridgefill.shipped_maps import SHIPPED, check_fit, describe, shipped_maps

REPO = pathlib.Path(__file__).resolve().parents[1]
QWEN = "qwen2.5-coder-0.5b"


def test_the_demo_model_has_shipped_maps_and_they_are_package_data():
    entry = shipped_maps(QWEN, 12)
    assert entry is not None and entry in SHIPPED and shipped_maps(QWEN, 14) == entry  # the rows policy's long prompts
    assert shipped_maps(QWEN, 6) is None and shipped_maps("smollm2-135m", 12) is None
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"sgl_ridgefill" = ["demo_maps/*/*.json", "demo_maps/*/*.safetensors"' in pyproject
    assert entry.path.parent == REPO / "sgl_ridgefill" / "demo_maps"
    files = {p.name for p in entry.path.iterdir()}
    assert {"manifest.json", "maps-split12.safetensors", "maps-split14.safetensors", "token_counts.safetensors"} <= files
    assert sum(p.stat().st_size for p in entry.path.iterdir()) < 21 * 2**20


def test_shipped_maps_are_intact_and_fitted_as_the_demo_fits_them():
    entry = shipped_maps(QWEN, 12)
    folder = load_maps(entry.path)  # sha256 of every file against the manifest
    manifest = folder.manifest
    assert folder.splits == entry.splits == (12, 14) and folder.default_split == 12
    assert folder.quant(12) == folder.quant(14) == "int8" == entry.quant
    assert folder.num_layers == 24 and folder.d_in == folder.d_out == 896
    assert folder.calibration_dtype in ("bfloat16", "float32")
    calibration = manifest["calibration"]
    assert calibration["tokens"] >= entry.tokens == 200_000
    assert {s["name"] for s in calibration["corpus"]["sources"]} == {"kjv", "python-docs", "python-stdlib"}
    assert manifest["model"]["layers"]["count"] == 24 and manifest["tokenizer"] is not None
    for split in ("12", "14"):
        scores = manifest["splits"][split]["heldout"]
        assert scores["mean_r2"] > scores["mean_r2_identity"]
    assert describe(manifest) == (
        f"int8, split 12 (also 14), {calibration['tokens'] / 1000:.0f}K tokens of builtin, fitted in "
        f"{folder.calibration_dtype}"
    )


def test_a_tampered_or_foreign_folder_does_not_fit(tmp_path):
    copy = tmp_path / "maps"
    shutil.copytree(shipped_maps(QWEN, 12).path, copy)
    (copy / "token_counts.safetensors").write_bytes(b"changed")
    fit = check_fit(copy, tmp_path / "unused-model", fingerprints=({}, {}))
    assert not fit.ok and "fails its sha256 check" in fit.reason
    fit = check_fit(shipped_maps(QWEN, 12).path, tmp_path, fingerprints=(_other_model(), None))
    assert not fit.ok and "does not match the served model" in fit.reason


def _other_model() -> dict:
    manifest = json.loads((shipped_maps(QWEN, 12).path / "manifest.json").read_text())
    other = json.loads(json.dumps(manifest["model"]))
    other["hidden_size"] = 1024
    return other


@pytest.mark.skipif(cached_model_dir(QWEN) is None, reason="Qwen2.5-Coder-0.5B is not converted here "
                    "(sgl-ridgefill model fetch qwen2.5-coder-0.5b)")
def test_shipped_maps_fit_the_model_converted_here():
    """Loads the converted model in transformers (a few seconds) for its fingerprints."""
    fit = check_fit(shipped_maps(QWEN, 12).path, cached_model_dir(QWEN))
    assert fit.ok and fit.warnings == (), fit
