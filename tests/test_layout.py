"""The top-level folders are importable only under sgl_ridgefill and never shadow other modules."""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run_from_root(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_stdlib_selectors_and_asyncio_work_from_the_repository_root():
    out = _run_from_root("import asyncio, selectors; print(selectors.__file__); print(hasattr(selectors, 'SelectSelector'))")
    path, has = out.split()
    assert not path.startswith(str(REPO)) and has == "True"


def test_kernels_is_the_pypi_package_from_the_repository_root():
    out = _run_from_root("import kernels; print(kernels.__file__)")
    assert not out.strip().startswith(str(REPO / "kernels"))


def test_folders_are_sgl_ridgefill_subpackages():
    out = _run_from_root(
        "import sgl_ridgefill.selectors as s, sgl_ridgefill.kernels.quant as q, sgl_ridgefill.policies as p\n"
        "print(list(s.__path__)[0]); print(q.__file__); print(p.__file__)"
    )
    sel, quant, pol = (pathlib.Path(p).resolve() for p in out.split())
    assert sel == REPO / "selectors"
    assert quant == REPO / "kernels" / "quant.py"
    assert pol == REPO / "policies" / "__init__.py"


def test_the_package_reaches_the_folders_through_relative_links():
    # Links inside sgl_ridgefill/ put the folders on the package's own __path__: no sys.path or
    # __path__ edits, and nothing else at the repository root becomes a sub-package.
    for name in ("selectors", "kernels", "policies"):
        link = REPO / "sgl_ridgefill" / name
        assert link.is_symlink() and str(link.readlink()) == f"../{name}", name


def test_subpackages_and_stdlib_asyncio_import_together_from_the_repository_root():
    out = _run_from_root(
        "import sgl_ridgefill.selectors.registry, sgl_ridgefill.kernels.map_apply, sgl_ridgefill.policies, asyncio, selectors\n"
        "print(asyncio.__file__); print(selectors.__file__)"
    )
    for path in out.split():
        assert not path.startswith(str(REPO)), path


def test_only_the_mapped_folders_are_subpackages():
    # The repository's other top-level folders are not part of the package.
    for name in ("tests", "docs"):
        proc = subprocess.run(
            [sys.executable, "-c", f"import sgl_ridgefill.{name}"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, name


def test_no_init_files_in_namespace_folders():
    assert not (REPO / "selectors" / "__init__.py").exists()
    assert not (REPO / "kernels" / "__init__.py").exists()
