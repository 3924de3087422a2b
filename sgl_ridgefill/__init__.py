"""sgl-ridgefill: training-free late-layer cache fill for faster prefill, as an SGLang plugin."""

from pathlib import Path as _Path

__version__ = "0.1.0"


def _expose_top_level_folders() -> None:
    """Make ``selectors/``, ``kernels/`` and ``policies/`` importable as sub-packages from a source tree.

    The repository keeps these folders at its top level (pyproject maps them into this package with
    ``package-dir``). ``selectors/`` and ``kernels/`` carry no ``__init__.py`` on purpose: a regular package
    named ``selectors`` would shadow the standard library's (asyncio imports it) whenever the repository
    root is on ``sys.path``, while a folder without one loses to the standard library. An installed wheel
    already has them inside this package; a source checkout (editable install, tests) needs the repository
    root on this package's ``__path__``, because setuptools' editable finder does not resolve nested
    namespace packages.
    """
    here = _Path(__file__).resolve().parent
    root = here.parent
    if (here / "selectors").is_dir() or not (root / "pyproject.toml").is_file():
        return
    if (root / "selectors").is_dir() and str(root) not in __path__:
        __path__.append(str(root))


_expose_top_level_folders()
