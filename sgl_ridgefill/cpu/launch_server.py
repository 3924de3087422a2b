"""``python -m sgl_ridgefill.cpu.launch_server [sglang flags]``: SGLang's server on a CPU-only machine.

Sets up the environment (``environment.py``: the ``sgl_kernel`` stand-in, ``SGLANG_USE_CPU_ENGINE``) and adds
the CPU flags the caller did not give (``--device cpu --attention-backend ridgefill_cpu``, CUDA graphs off,
the PyTorch sampler, ``--sleep-on-idle``, ``--watchdog-timeout 3600``: a long prefill on a few cores outlasts
SGLang's 300 s; for a Gated DeltaNet hybrid also ``--mamba-radix-cache-strategy no_buffer
--disable-overlap-schedule``), then runs ``python -m sglang.launch_server`` with everything else
passed through. Without ``--dtype`` it adds this CPU's dtype (``dtype.py``: bfloat16 where its matmuls run
natively, float32 elsewhere) and says which and why on its first line; ``--dtype auto`` is passed through to
SGLang (the checkpoint's own dtype). ``--tp-size N`` and ``--disaggregation-mode prefill|decode`` get the CPU
recipe of ``parallel.py`` (core groups per rank, no NCCL, Mooncake over TCP pinned to the server's address).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from .environment import CPU_SERVER_ARGS, HYBRID_CPU_SERVER_ARGS, cpu_environment, is_hybrid_model
from .parallel import Layout, flag_values, parallel_environment, parallel_flags


def _model_path(argv: list[str]) -> str | None:
    values = flag_values(argv)
    return values.get("--model-path") or values.get("--model")


def cpu_flags(argv: list[str], extra: Mapping[str, object] | None = None) -> list[str]:
    """``argv`` plus every CPU default (and every ``extra`` flag) whose flag ``argv`` does not already set
    (``True`` defaults are switches: the flag alone); a hybrid model's folder adds the hybrid defaults."""
    given = _given(argv)
    out = list(argv)
    defaults = dict(CPU_SERVER_ARGS)
    if is_hybrid_model(_model_path(argv)):
        defaults.update(HYBRID_CPU_SERVER_ARGS)
    for key, value in {**defaults, **(extra or {})}.items():
        flag = "--" + key.replace("_", "-")
        if flag in given or value is False or value is None:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def _given(argv: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def dtype_flags(argv: list[str], log=None) -> list[str]:
    """``argv`` plus ``--dtype D`` for this CPU when ``argv`` has no ``--dtype``; ``log`` gets the line
    saying which dtype and why."""
    if "--dtype" in _given(argv):
        return list(argv)
    from .dtype import choose_dtype

    choice = choose_dtype()
    if log is not None:
        log(choice.line())
    return [*argv, "--dtype", choice.dtype]


def command(argv: list[str], log=None) -> tuple[list[str], dict[str, str]]:
    """The ``sglang.launch_server`` command line and its environment for ``argv`` (``log``: as for
    :func:`dtype_flags`)."""
    layout = Layout.from_argv(argv)
    env = cpu_environment()
    env.update(parallel_environment(layout))
    flags = cpu_flags(dtype_flags(argv, log), parallel_flags(layout))
    return [sys.executable, "-m", "sglang.launch_server", *flags], env


def main(argv: list[str] | None = None) -> None:
    say = lambda line: print(f"[sgl-ridgefill] {line}", file=sys.stderr, flush=True)  # noqa: E731
    cmd, env = command(sys.argv[1:] if argv is None else argv, say)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
