"""Shared fixtures: tiny random checkpoints (built on first use, once per session) and real text."""

from __future__ import annotations

import inspect
import pathlib

import pytest

from tests.support.models import make_tiny_checkpoint


class _TinyModels:
    """``family -> HF folder`` of a 4-layer, d=64 random model; the tokenizer is trained once and copied."""

    def __init__(self, root: pathlib.Path) -> None:
        self._root = root
        self._paths: dict[str, pathlib.Path] = {}

    def __getitem__(self, family: str) -> pathlib.Path:
        if family not in self._paths:
            donor = self._paths.get("qwen2")
            path = make_tiny_checkpoint(self._root / family, family=family, num_layers=4, hidden_size=64,
                                        with_tokenizer=donor is None)
            if donor is not None:
                for f in donor.iterdir():
                    if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
                        (path / f.name).write_bytes(f.read_bytes())
            self._paths[family] = path
        return self._paths[family]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    models = _TinyModels(tmp_path_factory.mktemp("models"))
    models["qwen2"]  # the tokenizer donor comes first
    return models


@pytest.fixture(scope="session")
def tiny_model(tiny_models):
    return tiny_models["qwen2"]


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory):
    """Eight real documents (standard library sources) as .txt files, plus one too short to use."""
    import json as json_module

    root = tmp_path_factory.mktemp("corpus")
    stdlib = pathlib.Path(inspect.getsourcefile(json_module)).parent.parent
    picked = [p for p in sorted(stdlib.glob("*.py")) if 2500 < p.stat().st_size < 6000][:8]
    assert len(picked) == 8
    for p in picked:
        (root / f"{p.stem}.txt").write_text(p.read_text())
    (root / "tiny.txt").write_text("too short")
    return root
