"""``python -m sgl_ridgefill.cpu.launch_server [sglang flags]``: SGLang's server on a CPU-only machine.

Sets up the environment (``environment.py``: the ``sgl_kernel`` stand-in, ``SGLANG_USE_CPU_ENGINE``) and adds
the CPU flags the caller did not give (``--device cpu --attention-backend ridgefill_cpu``, CUDA graphs off,
the PyTorch sampler, ``--sleep-on-idle``; for a Gated DeltaNet hybrid also ``--mamba-radix-cache-strategy
no_buffer --disable-overlap-schedule``), then runs ``python -m sglang.launch_server`` with everything else
passed through.
"""

from __future__ import annotations

import os
import sys

from .environment import CPU_SERVER_ARGS, HYBRID_CPU_SERVER_ARGS, cpu_environment, is_hybrid_model


def _model_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg in ("--model-path", "--model") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--model-path=", "--model=")):
            return arg.split("=", 1)[1]
    return None


def cpu_flags(argv: list[str]) -> list[str]:
    """``argv`` plus every CPU default whose flag ``argv`` does not already set (``True`` defaults are
    switches: the flag alone); a hybrid model's folder adds the hybrid defaults."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    out = list(argv)
    defaults = dict(CPU_SERVER_ARGS)
    if is_hybrid_model(_model_path(argv)):
        defaults.update(HYBRID_CPU_SERVER_ARGS)
    for key, value in defaults.items():
        flag = "--" + key.replace("_", "-")
        if flag in given or value is False or value is None:
            continue
        out += [flag] if value is True else [flag, str(value)]
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    env = cpu_environment()
    cmd = [sys.executable, "-m", "sglang.launch_server", *cpu_flags(argv)]
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
