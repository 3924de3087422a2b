"""The micro-benchmark runs and reports; the kernel modules import without triton or sglang."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from sgl_ridgefill.kernels import bench

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_runs_on_tiny_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--rows", "16", "--dims", "96", "--queries", "4", "--repeat", "1", "--device", "cpu"])
    lines = capsys.readouterr().out.splitlines()
    timed = [line for line in lines if "GFLOP/s" in line]
    labels = {line.split()[0] for line in timed}
    assert labels == {"map", "map-int8", "attention-received"}
    for line in timed:
        rate = float(re.search(r"([0-9.]+) GFLOP/s", line).group(1))
        assert rate > 0, line


def test_int8_error_of_gaussian_maps_matches_rounding_theory() -> None:
    errors = bench.int8_error(896)
    # Rounding to the nearest of 255 levels: at most half a step, 1/254 of the group's max (the slack
    # covers float32 rounding of A / scale inside the quantiser).
    assert 0.9 / 254 <= errors["element_vs_group_max"] <= (1 + 1e-4) / 254
    # Uniform rounding error has rms step/sqrt(12); a group of 128 Gaussians has max ~2.4-3.2 sigma,
    # so the relative error is about 2.7 / 127 / 3.46 ~ 0.006.
    assert 0.004 < errors["matrix_fro"] < 0.009
    assert errors["matrix_fro"] < errors["output_row_worst"] < 0.012


def test_kernel_modules_import_without_triton_or_sglang() -> None:
    code = (
        "import sys\n"
        "import sgl_ridgefill.kernels.map_apply, sgl_ridgefill.kernels.attention_stats\n"
        "import sgl_ridgefill.kernels.choose, sgl_ridgefill.kernels.rescale, sgl_ridgefill.kernels.bench\n"
        "print(sorted(m for m in ('triton', 'sglang') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_kernels_folder_stays_a_namespace_package() -> None:
    # A kernels/__init__.py would make `import kernels` from the repository root find this folder
    # instead of the PyPI package SGLang depends on.
    assert not (ROOT / "kernels" / "__init__.py").exists()
    proc = subprocess.run(
        [sys.executable, "-c", "import kernels, sys; print(getattr(kernels, '__file__', None))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    if proc.returncode != 0:
        pytest.skip("the PyPI kernels package is not installed")
    assert "site-packages" in proc.stdout or "dist-packages" in proc.stdout, proc.stdout
