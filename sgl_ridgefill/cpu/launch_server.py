"""``python -m sgl_ridgefill.cpu.launch_server [sglang flags]``: SGLang's server on a CPU-only machine.

Sets up the environment (``environment.py``: the ``sgl_kernel`` stand-in, ``SGLANG_USE_CPU_ENGINE``) and adds
the CPU flags the caller did not give (``--device cpu --attention-backend ridgefill_cpu``, CUDA graphs off,
the PyTorch sampler, ``--sleep-on-idle``), then runs ``python -m sglang.launch_server`` with everything else
passed through. Without ``--dtype`` it adds this CPU's dtype (``dtype.py``: bfloat16 where its matmuls run
natively, float32 elsewhere) and says which and why on its first line; ``--dtype auto`` is passed through to
SGLang (the checkpoint's own dtype).
"""

from __future__ import annotations

import os
import sys

from .environment import CPU_SERVER_ARGS, cpu_environment


def cpu_flags(argv: list[str]) -> list[str]:
    """``argv`` plus every CPU default whose flag ``argv`` does not already set (``True`` defaults are
    switches: the flag alone)."""
    given = _given(argv)
    out = list(argv)
    for key, value in CPU_SERVER_ARGS.items():
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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    env = cpu_environment()
    say = lambda line: print(f"[sgl-ridgefill] {line}", file=sys.stderr, flush=True)  # noqa: E731
    cmd = [sys.executable, "-m", "sglang.launch_server", *cpu_flags(dtype_flags(argv, say))]
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
