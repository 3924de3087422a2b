"""Start and stop an SGLang server from Python (the demo, benchmarks, the GPU check), waiting until it is
healthy; by default the CPU launcher."""

from __future__ import annotations

import contextlib
import pathlib
import socket
import subprocess
import sys
import time
from typing import Callable

from .environment import cpu_environment


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    flags: list[str], *, log_path: pathlib.Path | None = None, timeout: float = 900, env: dict | None = None,
    command: list[str] | None = None, on_start: Callable[[subprocess.Popen], None] | None = None,
):
    """Yield the base URL of ``python -m sgl_ridgefill.cpu.launch_server FLAGS``; stop it afterwards.

    ``env``: the server's whole environment (default: this process's, set up for CPU); ``command``: what
    runs instead of the CPU launcher (``[python, "-m", "sglang.launch_server"]`` on a GPU machine);
    ``on_start``: called with the server process once it answers ``/health``."""
    import requests

    port = free_port()
    launcher = command or [sys.executable, "-m", "sgl_ridgefill.cpu.launch_server"]
    cmd = [*launcher, *flags, "--host", "127.0.0.1", "--port", str(port)]
    log = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env or cpu_environment(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                where = f"; see {log_path}" if log_path else ""
                raise RuntimeError(f"the server exited with code {proc.returncode} while starting{where}")
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"the server was not ready after {timeout:.0f} s")
            time.sleep(2)
        if on_start is not None:
            on_start(proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log_path:
            log.close()
