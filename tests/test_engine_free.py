"""The engine-free core imports no SGLang: it runs and tests on a bare CPU (maps, selectors, policy language, kernels, planners, metrics)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

# folder or file -> the import name of its top level
_CORE = (
    ("selectors", "sgl_ridgefill.selectors"),
    ("kernels", "sgl_ridgefill.kernels"),
    ("sgl_ridgefill/policy", "sgl_ridgefill.policy"),
    ("sgl_ridgefill/maps", "sgl_ridgefill.maps"),
    ("sgl_ridgefill/attention/planner.py", "sgl_ridgefill.attention.planner"),
    ("sgl_ridgefill/attention/steps.py", "sgl_ridgefill.attention.steps"),
    ("sgl_ridgefill/attention/metadata.py", "sgl_ridgefill.attention.metadata"),
    ("sgl_ridgefill/attention/staging.py", "sgl_ridgefill.attention.staging"),
    ("sgl_ridgefill/attention/contract.py", "sgl_ridgefill.attention.contract"),
    ("sgl_ridgefill/ledger.py", "sgl_ridgefill.ledger"),
    ("sgl_ridgefill/runtime/host_rows.py", "sgl_ridgefill.runtime.host_rows"),
    ("sgl_ridgefill/gpu_check/census.py", "sgl_ridgefill.gpu_check.census"),
    ("sgl_ridgefill/gpu_check/tiles.py", "sgl_ridgefill.gpu_check.tiles"),
    ("sgl_ridgefill/gpu_check/estimates.py", "sgl_ridgefill.gpu_check.estimates"),
    ("sgl_ridgefill/calibration/solve.py", "sgl_ridgefill.calibration.solve"),
    ("sgl_ridgefill/calibration/stats.py", "sgl_ridgefill.calibration.stats"),
    ("sgl_ridgefill/tools", "sgl_ridgefill.tools"),
    ("sgl_ridgefill/bench/results.py", "sgl_ridgefill.bench.results"),
    ("sgl_ridgefill/cpu/dtype.py", "sgl_ridgefill.cpu.dtype"),
    ("sgl_ridgefill/shipped_maps.py", "sgl_ridgefill.shipped_maps"),
    ("sgl_ridgefill/gdn_ops.py", "sgl_ridgefill.gdn_ops"),
    ("sgl_ridgefill/gdn_layout.py", "sgl_ridgefill.gdn_layout"),
    ("sgl_ridgefill/arch.py", "sgl_ridgefill.arch"),
)
_HOST = ("sglang", "sgl_kernel")


def core_modules() -> list[str]:
    """Import names of every engine-free module that exists in this tree."""
    names = []
    for where, name in _CORE:
        path = REPO / where
        if path.is_dir():
            names += [f"{name}.{p.stem}" if p.stem != "__init__" else name for p in sorted(path.glob("*.py"))]
        elif path.is_file():
            names.append(name)
    return names


def test_the_core_list_finds_modules():
    names = core_modules()
    assert "sgl_ridgefill.selectors.registry" in names and "sgl_ridgefill.policy.compiler" in names
    assert "sgl_ridgefill.tools.flops" in names and "sgl_ridgefill.tools.args" in names and "sgl_ridgefill.kernels.map_apply" in names


def test_engine_free_core_imports_no_sglang():
    code = (
        "import importlib, sys\n"
        f"for name in {core_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_HOST!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
