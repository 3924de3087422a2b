"""Start a real SGLang HTTP server on CPU for tests, with no RIDGEFILL_* variable inherited from the caller."""

from __future__ import annotations

import contextlib
import os

from sgl_ridgefill.cpu.environment import cpu_environment
from sgl_ridgefill.cpu.launch_server_process import running_server


@contextlib.contextmanager
def cpu_server(args: list[str], env: dict | None = None, timeout: float = 900):
    full_env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    full_env.update(env or {})
    log = os.environ.get("RIDGEFILL_TEST_SERVER_LOG")
    with running_server(args, env=full_env, timeout=timeout, log_path=log and os.path.abspath(log)) as url:
        yield url
