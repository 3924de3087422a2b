"""The model dtype for this CPU: bfloat16 where its matmuls run natively, float32 elsewhere.

On a CPU without bfloat16 instructions, PyTorch's bfloat16 matmul converts in software: on a 2-core
AVX2 machine it ran at 4.5 GFLOP/s against 28.5 for float32 (2048x896 by 896x4864, measured side by
side), about 6x slower. A bfloat16 model there (``--dtype bfloat16``, or a measurement resumed in the dtype
its records were taken in) computes its projections through float32 instead (``matmul.py``: the same sums),
which leaves it about 1.2x slower than float32 (Qwen2.5-Coder-0.5B, 1,024 tokens in ``transformers`` on a
2-core Intel Xeon without AVX-512 BF16: ``bench.bf16_matmul --float32``); float32 stays the pick there.
Where the CPU has AVX-512 BF16 or AMX, bfloat16 is the faster one (and halves the memory).

The check (:func:`native_bf16`) asks PyTorch, no timing involved:

1. the hardware: ``torch.cpu._is_amx_tile_supported()`` or ``torch.cpu._is_avx512_bf16_supported()``
   (cpuinfo's view of the CPU);
2. the ISA PyTorch dispatches to: ``torch.backends.cpu.get_cpu_capability()`` is ``AVX512`` (it honours
   ``ATEN_CPU_CAPABILITY``, so a capped process counts as the capped CPU);
3. the ISA oneDNN, which runs bfloat16 matmuls, may use: ``ONEDNN_MAX_CPU_ISA``, when set, must allow
   ``AVX512_CORE_BF16`` or above. Capped at ``AVX2`` on a CPU with AMX a bfloat16 matmul measured
   1.2 GFLOP/s, so the caps must count, not only the hardware.

Nothing here imports SGLang; ``torch`` is imported when a check runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

AUTO = "auto"
DTYPES = ("bfloat16", "float32")
CHOICES = (AUTO, *DTYPES)
# oneDNN ISA names (ONEDNN_MAX_CPU_ISA) under which oneDNN still has bfloat16 dot-product instructions.
_ONEDNN_BF16_ISAS = frozenset({
    "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2",
    "ALL", "DEFAULT",
})
# "auto" | "native": bfloat16 matmuls through float32 where the CPU has no bfloat16 (``matmul.py``); declared
# here, below the server's settings, so that ``cpu/`` reads it without importing up; ``envs.py`` lists it.
BF16_MATMUL = "RIDGEFILL_BF16_MATMUL"
SLOWDOWN_WITHOUT_NATIVE = 1.2  # a bfloat16 forward (matmuls through float32) / a float32 one, without native bfloat16


@dataclasses.dataclass(frozen=True)
class CpuFeatures:
    """What the dtype choice reads: PyTorch's dispatch capability, the CPU's bfloat16 instructions, and
    oneDNN's ISA cap (``None`` when not set)."""

    capability: str
    avx512_bf16: bool
    amx: bool
    onednn_max_isa: str | None = None

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> CpuFeatures:
        import torch

        env = os.environ if environ is None else environ
        cpu = torch.cpu
        return cls(
            capability=str(torch.backends.cpu.get_cpu_capability()),
            avx512_bf16=bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()),
            amx=bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()),
            onednn_max_isa=(env.get("ONEDNN_MAX_CPU_ISA") or None),
        )

    @property
    def hardware_bf16(self) -> str | None:
        """``"AMX"``, ``"AVX-512 BF16"`` or ``None``: the CPU's own bfloat16 instructions."""
        return "AMX" if self.amx else "AVX-512 BF16" if self.avx512_bf16 else None

    def why_not_native(self) -> str | None:
        """``None`` when bfloat16 matmuls run natively here, else the reason they do not."""
        if self.hardware_bf16 is None:
            return f"this CPU ({self.capability}) has no native bfloat16 matmul"
        if not self.capability.upper().startswith("AVX512"):
            return f"PyTorch runs this process at {self.capability} (ATEN_CPU_CAPABILITY), without bfloat16 instructions"
        if self.onednn_max_isa is not None and self.onednn_max_isa.upper() not in _ONEDNN_BF16_ISAS:
            return f"ONEDNN_MAX_CPU_ISA={self.onednn_max_isa} keeps oneDNN from its bfloat16 instructions"
        return None

    @property
    def native_bf16(self) -> bool:
        return self.why_not_native() is None


@dataclasses.dataclass(frozen=True)
class DtypeChoice:
    """The dtype a CPU path runs the model in, and the line that says why."""

    dtype: str
    reason: str
    chosen_by_user: bool = False
    matmuls_through_float32: bool = False  # bfloat16 on a CPU without it (``cpu/matmul.py``)

    def line(self) -> str:
        """``dtype: float32 (this CPU (AVX2) has no native bfloat16 matmul; ...)``, and for bfloat16 on such a
        CPU where its matmuls run."""
        through = "; its matmuls run through float32" if self.matmuls_through_float32 else ""
        return f"dtype: {self.dtype} ({self.reason}{through})"


def native_bf16(features: CpuFeatures | None = None) -> bool:
    """Whether this process runs bfloat16 matmuls natively (see the module docstring for the check)."""
    return (features or CpuFeatures.detect()).native_bf16


def choose_dtype(
    requested: str | None = AUTO, features: CpuFeatures | None = None, *, recorded: str | None = None,
    recorded_by: str = "the records being resumed were measured in it",
) -> DtypeChoice:
    """The dtype to run in, by precedence: ``requested`` (``"bfloat16"``/``"float32"``) when the user chose
    one; else ``recorded``, the dtype of the records a measurement adds to or is paired with (``recorded_by``
    says which, as the reason: records of two dtypes are not one measurement, whatever this CPU would pick);
    else the hardware's pick.

    Raises ``ValueError`` for any other value."""
    if requested not in (None, *CHOICES):
        raise ValueError(f"dtype must be one of {', '.join(CHOICES)}, got {requested!r}")
    if recorded is not None and recorded not in DTYPES:
        raise ValueError(f"recorded dtype must be one of {', '.join(DTYPES)}, got {recorded!r}")
    features = features or CpuFeatures.detect()
    if requested in DTYPES:
        return _where_matmuls_run(DtypeChoice(requested, "chosen with --dtype", chosen_by_user=True), features)
    why_not = features.why_not_native()
    if why_not is None:
        pick = DtypeChoice("bfloat16", f"this CPU ({features.capability}) has native bfloat16 matmuls ({features.hardware_bf16})")
    else:
        pick = DtypeChoice("float32", f"{why_not}; bfloat16 would run ~{SLOWDOWN_WITHOUT_NATIVE}x slower")
    if recorded is None:
        return pick
    why = recorded_by if pick.dtype == recorded else f"{recorded_by}; this CPU would pick {pick.dtype}: {pick.reason}"
    return _where_matmuls_run(DtypeChoice(recorded, why), features)


def _where_matmuls_run(choice: DtypeChoice, features: CpuFeatures) -> DtypeChoice:
    """``choice``, marked when it is bfloat16 on a CPU whose bfloat16 matmuls run through float32."""
    if choice.dtype != "bfloat16":
        return choice
    from .matmul import through_float32

    return dataclasses.replace(choice, matmuls_through_float32=through_float32(features))


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux), else ``None``."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip() or None
    except OSError:
        pass
    return None
