"""The kernels tier of the GPU check: its CPU smoke mode runs every step for real (tiny sizes, float32, the
Triton interpreter, SGLang's extend kernel from copied files), and the check never imports SGLang."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from sgl_ridgefill.gpu_check.cli import KERNEL_STEPS
from sgl_ridgefill.gpu_check.sgl_files import SGL_FILES, SglFilesMissing, copy_sgl_files, load_extend_attention

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def _check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "sgl_ridgefill.gpu_check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, pathlib.Path]:
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    tmp = tmp_path_factory.mktemp("gpu-check")
    sgl_files = tmp / "sgl_files"
    if HAS_SGLANG:
        copy_sgl_files(sgl_files)  # as the preparation does; SGLang itself is never imported
    proc = _check("--device", "cpu", "--sgl-files", str(sgl_files), "--out", str(tmp / "out"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp / "out" / "gpu-check.json").read_text()), proc.stdout, tmp / "out"


def test_smoke_mode_runs_every_step(smoke) -> None:
    report, stdout, out = smoke
    assert list(report["steps"]) == list(KERNEL_STEPS)
    assert report["dtype"] == "torch.float32" and report["environment"]["triton_interpret"] == "1"
    for name, step in report["steps"].items():
        if name == "row_attention" and not HAS_SGLANG:
            assert step["status"] == "skipped" and "--copy-sgl-files" in step["note"]
            continue
        assert step["status"] == "ok", (name, step["note"])
        assert step["rows"], name
        assert all(row.get("ok", True) for row in step["rows"]), name
        assert f"== {name}: ok" in stdout
    assert (out / "gpu-check.txt").read_text().count("== ") == len(KERNEL_STEPS)
    assert report["sglang_imported"] is False


def test_smoke_maps_compare_both_backends_and_record_the_runtime_choice(smoke) -> None:
    rows = smoke[0]["steps"]["maps"]["rows"]
    assert rows[0]["runtime_choice"] == "reference"  # off CUDA nothing is measured
    timed = [r for r in rows if "backend" in r]
    assert {r["backend"] for r in timed} == {"torch", "triton"}
    assert all(r["ms"] > 0 and r["max_rel_err"] <= 2e-5 for r in timed)


def test_smoke_map_stream_gives_the_resident_maps_fill(smoke) -> None:
    (row,) = smoke[0]["steps"]["map_stream"]["rows"]
    assert row["ok"] is True and row["layers"] == 4  # streamed through the runtime's StreamedMaps, K/V equal
    assert row["copy_ms_per_layer"] > 0 and row["resident_ms"] > 0 and row["streamed_ms"] > 0


def test_smoke_calibration_compares_the_device_accumulation_with_the_cpu(smoke) -> None:
    from sgl_ridgefill.calibration.precision import MAP_TOLERANCE, R2_TOLERANCE
    from sgl_ridgefill.calibration.stats import CUDA_ACCUMULATION

    (row,) = smoke[0]["steps"]["calibration"]["rows"]
    assert row["accumulate"] == CUDA_ACCUMULATION and row["train_rows"] > 0
    assert row["r2_max_diff"] <= R2_TOLERANCE and row["map_rel_diff"] <= MAP_TOLERANCE and row["ok"] is True
    assert 0 < row["mean_r2_cpu"] <= 1


def test_smoke_planner_covers_every_backend(smoke) -> None:
    rows = smoke[0]["steps"]["planner"]["rows"]
    assert {r["backend"] for r in rows} == {"triton", "flashinfer", "fa3"}
    for row in rows:
        # Tail 16 of 96 plus every 10th of the 80 prefix rows: 8 rows in groups of 4, the tail one run.
        assert (row["rows"], row["group_size"], row["steps"], row["virtual_requests"]) == (24, 4, 1, 3)
        assert row["host_ms"] > 0


def test_smoke_host_path_plans_every_backend_and_selection(smoke) -> None:
    rows = smoke[0]["steps"]["host_path"]["rows"]
    assert {(r["selection"], r["backend"]) for r in rows} == {
        (s, b) for s in ("no rows", "10% pooled attention", "probe policy (~30%)") for b in ("triton", "flashinfer", "fa3")
    }
    for row in rows:
        assert row["device"] == "meta" and row["cuda_syncs"] is None  # CUDA's own count runs on a GPU only
        assert row["host_ms"] > 0
        # No dense host mask: the probe's visible keys are one byte per key of the 16K prompt, the rest none.
        assert row["mask_bytes"] == (16384 if row["selection"].startswith("probe") else 0)
        assert (row["device_mask_bytes"] > 0) == (row["selection"] != "no rows")


@pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed here to copy its Triton files from")
def test_smoke_row_attention_matches_the_reference_in_every_case(smoke) -> None:
    rows = smoke[0]["steps"]["row_attention"]["rows"]
    assert [r["case"] for r in rows] == ["exact", "tail", "runs", "grouped G=4", "windows 4"]
    assert rows[0]["ratio_to_exact"] == 1.0 and all(r["max_abs_err"] <= 1e-4 for r in rows)
    assert [r["launches"] for r in rows] == [1, 1, 1, 2, 1]


def test_without_cuda_the_check_skips_itself(tmp_path: pathlib.Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _check("--out", str(tmp_path), timeout=120)
    assert proc.returncode == 0
    assert proc.stdout.strip() == (
        "gpu-check: no CUDA device here: the kernels tier skips itself (--device cpu runs its CPU smoke mode)"
    )
    assert not (tmp_path / "gpu-check.json").exists()


def test_missing_sgl_files_are_named_with_the_preparation(tmp_path: pathlib.Path) -> None:
    (tmp_path / "score_mod.py").write_text("")
    with pytest.raises(SglFilesMissing) as info:
        load_extend_attention(tmp_path)
    assert str(info.value) == (
        f"{tmp_path} lacks decode_attention.py, extend_attention.py; prepare it where SGLang is installed with "
        f"`python -m sgl_ridgefill.gpu_check --copy-sgl-files {tmp_path}`"
    )


def test_the_sgl_files_folder_is_ignored_by_git() -> None:
    proc = subprocess.run(["git", "check-ignore", "-q", ".gpucheck/sgl_files/extend_attention.py"], cwd=ROOT)
    assert proc.returncode == 0
    assert SGL_FILES == ("score_mod.py", "decode_attention.py", "extend_attention.py")


def test_the_check_imports_no_sglang() -> None:
    code = (
        "import sys\n"
        "import sgl_ridgefill.gpu_check\n"
        "import sgl_ridgefill.gpu_check.cli, sgl_ridgefill.gpu_check.check, sgl_ridgefill.gpu_check.kernel_steps\n"
        "import sgl_ridgefill.gpu_check.row_attention, sgl_ridgefill.gpu_check.server, sgl_ridgefill.gpu_check.report\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'sgl_kernel', 'flashinfer')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
