"""Start a real SGLang HTTP server on CPU for tests, with no RIDGEFILL_* variable inherited from the caller.

The server runs through the CPU launcher (``sgl_ridgefill.cpu.launch_server``), which also sets up tensor
parallelism and PD disaggregation from the flags; this checkout comes first on its ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

from sgl_ridgefill.cpu.environment import cpu_environment
from sgl_ridgefill.cpu.launch_server_process import running_server

REPO = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def cpu_server(args: list[str], env: dict | None = None, timeout: float = 900, log_path: str | None = None,
               command: list[str] | None = None):
    full_env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    full_env["PYTHONPATH"] = os.pathsep.join([full_env["PYTHONPATH"], str(REPO)])
    full_env.update(env or {})
    log = log_path or os.environ.get("RIDGEFILL_TEST_SERVER_LOG")
    with running_server(args, env=full_env, timeout=timeout, log_path=log and os.path.abspath(log),
                        command=command) as url:
        yield url
