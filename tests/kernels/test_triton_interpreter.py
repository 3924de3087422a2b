"""Triton kernels vs their PyTorch references on CPU, under ``TRITON_INTERPRET=1`` in a subprocess.

The interpreter must be switched on before triton decorates a kernel, and switching it on here would
leak into every other test of this process, so the cases run once in a child process
(``tests/kernels/interpreter_cases.py``) and each case becomes one test here.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from sgl_ridgefill.kernels.choose import TOLERANCE
from tests.kernels.interpreter_cases import CASES

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Worst |triton - reference| relative to the reference's largest entry, by output dtype: the bounds the
# startup choice holds a map backend to on the GPU.
TOL = {str(dtype).removeprefix("torch."): tol for dtype, tol in TOLERANCE.items()}


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.interpreter_cases"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"interpreter cases failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    return report["cases"]


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_reference(results: dict, name: str) -> None:
    result = results[name]
    assert result["launches"] > 0, "the reference ran instead of a kernel"
    assert result["interpreted"], "a launched kernel was not an interpreted Triton function"
    assert result["same_dtype"]
    assert result["err"] <= TOL[result["dtype"]], result
    if result["dtype"] != "float32":
        # Both sides accumulate in float32 and round once, so an entry may differ by one rounding step.
        assert result["ulps"] <= 1.0, result
