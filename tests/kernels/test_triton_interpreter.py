"""Triton kernels vs their PyTorch references on CPU, under ``TRITON_INTERPRET=1`` in a subprocess.

The interpreter must be switched on before triton decorates a kernel, and switching it on here would
leak into every other test of this process, so the cases run once in a child process
(``tests/kernels/interpreter_cases.py``) and each case becomes one test here.
"""

from __future__ import annotations

import pytest

from sgl_ridgefill.kernels.choose import TOLERANCE
from tests.kernels.interpreter_cases import CASES
from tests.support.interpreter import run_cases


# Worst |triton - reference| relative to the reference's largest entry, by output dtype: the bounds the
# startup choice holds a map backend to on the GPU.
TOL = {str(dtype).removeprefix("torch."): tol for dtype, tol in TOLERANCE.items()}


@pytest.fixture(scope="module")
def results() -> dict:
    return run_cases("tests.kernels.interpreter_cases")


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
