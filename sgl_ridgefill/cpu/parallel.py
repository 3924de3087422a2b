"""The CPU recipe for SGLang's tensor parallelism and prefill/decode (PD) disaggregation.

Stock SGLang 0.5.23 runs both on a CPU-only machine given a few settings:

- **Tensor parallelism** (``--tp-size N``): collectives are ``torch.distributed`` on gloo.
  ``SGLANG_CPU_OMP_THREADS_BIND`` needs one ``|``-separated core group per rank (without it SGLang asserts
  that there are at least as many NUMA nodes as ranks); ``SGLANG_NCCL_SO_PATH`` points at a missing file,
  because the CUDA torch wheel ships NCCL and SGLang would otherwise build a NCCL communicator on the CPU
  device and fail; ``--disable-custom-all-reduce``; each rank gets ``cores // N`` intra-op threads, so
  the ranks do not oversubscribe the cores. ``TORCHDYNAMO_DISABLE=1`` skips the one-off ``torch.compile``
  of the vocabulary-parallel embedding's mask (about 20 s on the first forward; eager is the same maths).
- **PD disaggregation** (``--disaggregation-mode prefill|decode``): Mooncake's TCP transport
  (``--disaggregation-transfer-backend mooncake_tcp``; the package ``mooncake-transfer-engine-non-cuda``,
  the project's ``pd`` extra, whose ``engine.so`` needs the system library ``libibverbs1`` even for TCP).
  The prefill worker runs without the overlap scheduler (its delayed send records a CUDA event); the
  decode worker backs retracted requests up in host tensors (``cpu_tensor``; the default pins memory with
  CUDA). The prefill sender's pinned-memory index copy is switched off by a hook (``patches.py``). When the
  server listens on one address (``--host``, 127.0.0.1 by default), the transfer engine is pinned to it
  too (``SGLANG_HOST_IP``, ``MC_TCP_BIND_ADDRESS``); without that it binds the machine's external address.

Nothing here changes a flag or variable the caller set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A path that never exists: PyNccl fails to load it and SGLang switches it off (one harmless ERROR line).
NO_NCCL = "/nonexistent/ridgefill-cpu/libnccl.so.2"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")

TP_FLAGS: dict[str, object] = {"disable_custom_all_reduce": True}
PD_FLAGS: dict[str, dict[str, object]] = {
    "prefill": {"disaggregation_transfer_backend": "mooncake_tcp", "disable_overlap_schedule": True},
    "decode": {"disaggregation_transfer_backend": "mooncake_tcp", "disaggregation_decode_retraction_backup": "cpu_tensor"},
}


@dataclass(frozen=True)
class Layout:
    """What the command line asks for: tensor-parallel ranks, PD role, listening address."""

    tp_size: int = 1
    disaggregation_mode: str = "null"
    host: str = "127.0.0.1"  # SGLang's default --host

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> Layout:
        values = flag_values(argv)
        tp = values.get("--tp-size") or values.get("--tensor-parallel-size") or "1"
        try:
            tp_size = int(tp)
        except ValueError:
            raise ValueError(f"--tp-size must be an integer, got {tp!r}") from None
        return cls(tp_size=tp_size, disaggregation_mode=values.get("--disaggregation-mode", "null"),
                   host=values.get("--host", "127.0.0.1"))

    @property
    def disaggregated(self) -> bool:
        return self.disaggregation_mode in PD_FLAGS


def flag_values(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` and ``--flag=value`` pairs of ``argv`` (the last one wins)."""
    out: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            out[key] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[arg] = argv[i + 1]
    return out


def core_groups(cores: Sequence[int], ranks: int) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``ranks`` ranks over ``cores``: one ``|``-separated group of
    comma-separated core ids per rank (ranks share cores round-robin when there are fewer cores)."""
    cores = sorted(cores) or [0]
    if len(cores) < ranks:
        return "|".join(str(cores[r % len(cores)]) for r in range(ranks))
    per = len(cores) // ranks
    return "|".join(",".join(str(c) for c in cores[r * per : (r + 1) * per]) for r in range(ranks))


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def parallel_environment(layout: Layout, base: Mapping[str, str] | None = None,
                         cores: Sequence[int] | None = None) -> dict[str, str]:
    """The variables ``layout`` needs on CPU that ``base`` (default ``os.environ``) does not set already."""
    base = os.environ if base is None else base
    cores = _affinity() if cores is None else list(cores)
    out: dict[str, str] = {}
    if layout.tp_size > 1:
        out["SGLANG_CPU_OMP_THREADS_BIND"] = core_groups(cores, layout.tp_size)
        out["SGLANG_NCCL_SO_PATH"] = NO_NCCL
        out["OMP_NUM_THREADS"] = str(max(1, len(cores) // layout.tp_size))
        out["TORCHDYNAMO_DISABLE"] = "1"
    if layout.disaggregated and layout.host not in WILDCARD_HOSTS:
        out["SGLANG_HOST_IP"] = layout.host
        out["MC_TCP_BIND_ADDRESS"] = layout.host
    return {k: v for k, v in out.items() if k not in base}


def parallel_flags(layout: Layout) -> dict[str, object]:
    """Server flags (``ServerArgs`` field names) ``layout`` needs on CPU; the caller's own flags win."""
    flags: dict[str, object] = {}
    if layout.tp_size > 1:
        flags.update(TP_FLAGS)
    if layout.disaggregated:
        flags.update(PD_FLAGS[layout.disaggregation_mode])
    return flags


def tp_engine_kwargs(tp_size: int) -> dict[str, object]:
    """``sglang.Engine`` keywords for ``tp_size`` ranks on CPU (run it under ``parallel_environment``)."""
    return {"tp_size": tp_size, **(TP_FLAGS if tp_size > 1 else {})}
