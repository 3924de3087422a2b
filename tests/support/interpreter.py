"""Triton kernels under ``TRITON_INTERPRET=1`` on CPU, run in a child process.

The interpreter must be switched on before triton decorates a kernel, and switching it on in the test
process would leak into every other test, so a module of cases runs once in a child (``run_cases``); the
child counts the launches of the instrumented kernels (``main``), so a case that silently ran a PyTorch
fallback instead of a kernel is caught.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cases(module: str, *, env: dict | None = None, timeout: float = 600) -> dict:
    """Run ``python -m module`` under the interpreter; its per-case results (a pytest skip or failure
    otherwise)."""
    full_env = {**os.environ, "TRITON_INTERPRET": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{module} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    return report["cases"]


class CountingKernel:
    """Stands in for a kernel object: counts ``kernel[grid](...)`` launches and notes their type."""

    def __init__(self, kernel, record: dict) -> None:
        self._kernel, self._record = kernel, record

    def __getitem__(self, grid):
        self._record["launches"] += 1
        self._record["interpreted"] &= type(self._kernel).__name__ == "InterpretedFunction"
        return self._kernel[grid]


def main(cases: dict[str, Callable], kernels: Callable[[], Iterable[tuple[ModuleType, tuple[str, ...]]]],
         measure: Callable) -> None:
    """The child's side: instrument ``kernels()`` (module, kernel names), run every case
    (``fn() -> (got, want)``) and print one JSON line: ``{"cases": {name: measure(got, want) + launches}}``,
    or ``{"skip": reason}`` when triton or the interpreter is unavailable."""
    try:
        import triton
    except ImportError as error:
        print(json.dumps({"skip": f"triton is not importable: {error}"}))
        return
    if not triton.knobs.runtime.interpret:
        print(json.dumps({"skip": f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r} did not enable the interpreter"}))
        return
    record = {"launches": 0, "interpreted": True}
    try:
        for module, names in kernels():
            for name in names:
                setattr(module, name, CountingKernel(getattr(module, name), record))
    except ImportError as error:
        print(json.dumps({"skip": f"the kernels are not importable: {error}"}))
        return
    results = {}
    for name, fn in cases.items():
        record.update(launches=0, interpreted=True)
        got, want = fn()
        results[name] = {**measure(got, want), **record}
        print(f"{name}: {results[name]}", file=sys.stderr)
    print(json.dumps({"cases": results}))
