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
    sel, quant, pol = out.split()
    assert sel == str(REPO / "selectors")
    assert quant == str(REPO / "kernels" / "quant.py")
    assert pol == str(REPO / "policies" / "__init__.py")


def test_no_init_files_in_namespace_folders():
    assert not (REPO / "selectors" / "__init__.py").exists()
    assert not (REPO / "kernels" / "__init__.py").exists()
