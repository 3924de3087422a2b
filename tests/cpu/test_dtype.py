"""The model dtype by hardware: bfloat16 only where this process runs bfloat16 matmuls natively."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sgl_ridgefill.cpu.dtype import CpuFeatures, choose_dtype, cpu_model_name, native_bf16
from sgl_ridgefill.cpu.launch_server import dtype_flags

AMX = CpuFeatures("AVX512", avx512_bf16=True, amx=True)
ZEN4 = CpuFeatures("AVX512", avx512_bf16=True, amx=False)
SKYLAKE = CpuFeatures("AVX512", avx512_bf16=False, amx=False)
EPYC_AVX2 = CpuFeatures("AVX2", avx512_bf16=False, amx=False)


def test_native_cpus_get_bfloat16():
    assert choose_dtype("auto", AMX).line() == "dtype: bfloat16 (this CPU (AVX512) has native bfloat16 matmuls (AMX))"
    assert choose_dtype(None, ZEN4).line() == "dtype: bfloat16 (this CPU (AVX512) has native bfloat16 matmuls (AVX-512 BF16))"


def test_cpus_without_bfloat16_get_float32_and_say_why():
    assert choose_dtype("auto", EPYC_AVX2).line() == (
        "dtype: float32 (this CPU (AVX2) has no native bfloat16 matmul; bfloat16 would run ~1.2x slower)"
    )
    assert choose_dtype("auto", SKYLAKE).dtype == "float32"


def test_isa_caps_count_as_the_capped_cpu():
    aten_capped = CpuFeatures("AVX2", avx512_bf16=True, amx=True)
    assert not aten_capped.native_bf16
    assert "ATEN_CPU_CAPABILITY" in choose_dtype("auto", aten_capped).reason
    onednn_capped = CpuFeatures("AVX512", avx512_bf16=True, amx=True, onednn_max_isa="AVX2")
    assert choose_dtype("auto", onednn_capped).line() == (
        "dtype: float32 (ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN from its bfloat16 instructions; bfloat16 would run ~1.2x slower)"
    )
    assert CpuFeatures("AVX512", avx512_bf16=True, amx=True, onednn_max_isa="avx512_core_amx").native_bf16


def test_the_users_choice_wins():
    assert choose_dtype("bfloat16", AMX).line() == "dtype: bfloat16 (chosen with --dtype)"
    assert choose_dtype("bfloat16", EPYC_AVX2).line() == (
        "dtype: bfloat16 (chosen with --dtype; its matmuls run through float32)")
    assert choose_dtype("float32", AMX).dtype == "float32"
    with pytest.raises(ValueError, match="dtype must be one of auto, bfloat16, float32, got 'fp16'"):
        choose_dtype("fp16", AMX)


def test_a_measurement_resumed_on_another_cpu_keeps_the_dtype_it_was_recorded_in():
    """A run recorded in bfloat16 resumes in bfloat16 on a CPU that would pick float32 (and says what it
    costs); the user's --dtype still wins, and nothing recorded leaves the hardware's pick."""
    resumed = choose_dtype("auto", EPYC_AVX2, recorded="bfloat16")
    assert resumed.line() == (
        "dtype: bfloat16 (the records being resumed were measured in it; this CPU would pick float32: this CPU "
        "(AVX2) has no native bfloat16 matmul; bfloat16 would run ~1.2x slower; its matmuls run through float32)"
    )
    assert choose_dtype("auto", AMX, recorded="bfloat16").line() == (
        "dtype: bfloat16 (the records being resumed were measured in it)")
    assert choose_dtype("float32", AMX, recorded="bfloat16").dtype == "float32"
    assert choose_dtype("auto", AMX, recorded=None).dtype == "bfloat16"
    paired = choose_dtype("auto", EPYC_AVX2, recorded="bfloat16", recorded_by="the exact arm it reuses was measured in it")
    assert paired.line().startswith("dtype: bfloat16 (the exact arm it reuses was measured in it; this CPU would pick")
    with pytest.raises(ValueError, match="recorded dtype must be one of bfloat16, float32, got 'float16'"):
        choose_dtype("auto", AMX, recorded="float16")


def test_detect_reads_torch_and_the_environment():
    import torch

    features = CpuFeatures.detect({"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert features.capability == torch.backends.cpu.get_cpu_capability()
    assert features.onednn_max_isa == "AVX2" and not features.native_bf16
    assert native_bf16() == CpuFeatures.detect().native_bf16


def test_a_capped_process_picks_float32():
    """ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 (the AVX2 emulation) must read as a CPU without
    native bfloat16, whatever this machine has."""
    code = "from sgl_ridgefill.cpu.dtype import choose_dtype; print(choose_dtype().dtype)"
    env = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "float32"


def test_cpu_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: avx2\n")
    assert cpu_model_name(str(info)) == "AMD EPYC 7B13"
    assert cpu_model_name(str(tmp_path / "absent")) is None


def test_launcher_adds_the_hardware_dtype_unless_given():
    lines = []
    argv = dtype_flags(["--model-path", "m"], lines.append)
    assert argv[:2] == ["--model-path", "m"] and argv[2] == "--dtype" and argv[3] in ("bfloat16", "float32")
    assert lines == [choose_dtype().line()]
    assert dtype_flags(["--dtype", "auto"], lines.append) == ["--dtype", "auto"]
    assert dtype_flags(["--dtype=float32"], lines.append) == ["--dtype=float32"] and len(lines) == 1
