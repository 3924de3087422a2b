"""SGLang's Triton extend and decode kernels, fed by the planner, against the reference attention on CPU.

The kernels run under ``TRITON_INTERPRET=1``, which must be set before triton decorates a kernel and would
leak into every other test of this process, so the cases run once in a child process
(``tests/attention/sglang_triton_cases.py``) and each case becomes one test here.
"""

from __future__ import annotations

import pytest

from tests.attention.sglang_triton_cases import CASES
from tests.support.interpreter import run_cases

# float32 throughout: only the accumulation order differs from the float64 reference.
TOL = 2e-5


@pytest.fixture(scope="module")
def results() -> dict:
    # One intra-op thread: the tensors are tiny, and a thread pool only adds synchronisation on a busy machine.
    return run_cases("tests.attention.sglang_triton_cases", env={"OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_kernel_matches_reference(results: dict, name: str) -> None:
    result = results[name]
    assert result["launches"] > 0, "no SGLang kernel was launched"
    assert result["interpreted"], "a launched kernel was not an interpreted Triton function"
    assert result["finite"], result
    assert result["err"] <= TOL, result
