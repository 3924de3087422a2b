"""The wheel holds every package of the tree: ``pyproject.toml`` lists packages by hand (selectors/, kernels/
and policies/ are mapped in from the top level), so a new package left off the list would install without it
outside an editable checkout."""

from __future__ import annotations

import pathlib
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
MAPPED = {"sgl_ridgefill.selectors": "selectors", "sgl_ridgefill.kernels": "kernels", "sgl_ridgefill.policies": "policies"}


def _packages_under(root: pathlib.Path, name: str, skip: tuple[str, ...] = ()) -> set[str]:
    """Every folder under ``root`` that holds Python files (``selectors/`` and ``kernels/`` are namespace
    packages, without ``__init__.py``), as a package name under ``name``."""
    found = set()
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        rel = folder.relative_to(root).parts
        if (rel and rel[0] in skip) or "__pycache__" in rel or not any(folder.glob("*.py")):
            continue
        found.add(".".join((name, *rel)))
    return found


def _tree_packages() -> set[str]:
    # sgl_ridgefill/{selectors,kernels,policies} are the links of a source checkout; the wheel maps the
    # top-level folders in.
    found = _packages_under(REPO / "sgl_ridgefill", "sgl_ridgefill", skip=("selectors", "kernels", "policies"))
    for name, folder in MAPPED.items():
        found |= _packages_under(REPO / folder, name)
    return found


def test_every_package_of_the_tree_is_in_the_wheel():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert sorted(_tree_packages() - listed) == []
    assert sorted(listed - _tree_packages()) == []
    assert {k: v for k, v in config["package-dir"].items() if k != "sgl_ridgefill"} == MAPPED
