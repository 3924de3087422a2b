"""SGLang's Triton extend-attention kernel, loaded from copies of its files without importing SGLang.

A bare GPU machine often has torch and triton but no SGLang. SGLang 0.5.23's
extend kernel lives in three files of ``sglang/kernels/ops/attention/`` (:data:`SGL_FILES`) that need
only torch and triton, apart from a few SGLang imports: ``envs`` (feature switches, all off here), the
device predicates of ``sglang.srt.utils`` and, lazily in an MLA-only path, ``get_exec``. Small stand-ins
take their place while the files execute; afterwards every ``sglang`` name is removed from
``sys.modules`` again (or the real module put back), so nothing else in the process sees the stand-ins.

The files are SGLang's (Apache-2.0) and are never committed here: :func:`copy_sgl_files` copies them from
an installed SGLang into the ignored folder :data:`DEFAULT_DIR`, which then travels with the checkout::

    python -m sgl_ridgefill.gpu_check --copy-sgl-files .gpucheck/sgl_files
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import sys
import types

import torch

SGL_FILES = ("score_mod.py", "decode_attention.py", "extend_attention.py")  # in load order
PACKAGE = "sglang.kernels.ops.attention"
DEFAULT_DIR = pathlib.Path(".gpucheck/sgl_files")


class SglFilesMissing(FileNotFoundError):
    """The folder lacks one of :data:`SGL_FILES`; the message says how to prepare it."""


def copy_sgl_files(dest: str | pathlib.Path) -> list[pathlib.Path]:
    """Copy :data:`SGL_FILES` from the installed SGLang into ``dest``; returns the copies.

    SGLang is located with ``importlib.util.find_spec``, which does not execute it.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglFilesMissing("--copy-sgl-files: SGLang is not installed in this Python; run it where it is")
    source = pathlib.Path(list(spec.submodule_search_locations)[0]) / PACKAGE.removeprefix("sglang.").replace(".", "/")
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in SGL_FILES:
        if not (source / name).is_file():
            raise SglFilesMissing(f"--copy-sgl-files: {source / name} does not exist (is this SGLang 0.5.23?)")
        copies.append(pathlib.Path(shutil.copy2(source / name, dest / name)))
    return copies


def load_extend_attention(folder: str | pathlib.Path) -> types.ModuleType:
    """SGLang's ``extend_attention`` module loaded from ``folder`` (its ``extend_attention_fwd`` and kernels)."""
    folder = pathlib.Path(folder)
    missing = [name for name in SGL_FILES if not (folder / name).is_file()]
    if missing:
        raise SglFilesMissing(
            f"{folder} lacks {', '.join(missing)}; prepare it where SGLang is installed with "
            f"`python -m sgl_ridgefill.gpu_check --copy-sgl-files {folder}`"
        )
    stand_ins = _stand_ins()
    names = [*stand_ins, *(f"{PACKAGE}.{name.removesuffix('.py')}" for name in SGL_FILES)]
    saved = {name: sys.modules.get(name) for name in names}
    loaded = {}
    try:
        sys.modules.update(stand_ins)
        for file_name in SGL_FILES:
            name = f"{PACKAGE}.{file_name.removesuffix('.py')}"
            spec = importlib.util.spec_from_file_location(name, folder / file_name)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # the files import each other by these names
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return loaded[f"{PACKAGE}.extend_attention"]


class _Switch:
    """An ``envs.NAME`` of SGLang: every switch the kernels read is off."""

    def get(self) -> bool:
        return False


class _Envs:
    def __getattr__(self, name: str) -> _Switch:
        return _Switch()


def _get_exec():
    # SGLang raises ValueError while its runtime context is not published; the MLA decode path asks again later.
    raise ValueError("no SGLang runtime context in the GPU check")


def _device_core_count(device_index: int = 0) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count if torch.cuda.is_available() else 0


def _stand_ins() -> dict[str, types.ModuleType]:
    """Modules for every ``sglang`` name the three files import, packages included."""
    modules = {}
    for name in ("sglang", "sglang.srt", "sglang.kernels", "sglang.kernels.ops", PACKAGE):
        package = types.ModuleType(name)
        package.__path__ = []  # a package, so the files' dotted imports resolve through sys.modules
        modules[name] = package
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _Envs()
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = lambda: torch.cuda.is_available() and torch.version.cuda is not None
    utils.is_hip = lambda: torch.version.hip is not None
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = _device_core_count
    runtime_context = types.ModuleType("sglang.srt.runtime_context")
    runtime_context.get_exec = _get_exec
    modules.update({m.__name__: m for m in (environ, utils, runtime_context)})
    return modules
