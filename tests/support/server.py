"""Start a real SGLang HTTP server on CPU (``python -m sgl_ridgefill.cpu.launch_server``) for tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import requests

from sgl_ridgefill.cpu.environment import cpu_environment


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def cpu_server(args: list[str], env: dict | None = None, timeout: float = 600):
    """Yield the base URL of a server started with ``args`` (SGLang flags); stop it afterwards."""
    port = free_port()
    full_env = cpu_environment()
    for key in list(full_env):
        if key.startswith("RIDGEFILL_"):
            del full_env[key]
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "sgl_ridgefill.cpu.launch_server", *args, "--host", "127.0.0.1", "--port", str(port)]
    log = open(os.devnull, "w") if not os.environ.get("RIDGEFILL_TEST_SERVER_LOG") else None
    proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT if log else None)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before it was ready: {' '.join(cmd)}")
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise TimeoutError("server did not become ready")
            time.sleep(2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log:
            log.close()
