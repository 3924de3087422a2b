"""Start and stop an SGLang server from Python (the demo, benchmarks, the soak, the GPU check), waiting until
it is healthy; by default the CPU launcher."""

from __future__ import annotations

import contextlib
import pathlib
import socket
import subprocess
import sys
import time
from typing import Callable

from .environment import cpu_environment


# On CPU, SGLang leaves the KV cache what is still free after loading the weights minus (1 - this) of what was
# free before; float32 weights of the 0.5B model (2 GB) on a machine where other processes hold memory need
# more than 0.3. --max-total-tokens caps the pool, so a larger fraction allocates nothing more.
MEM_FRACTION_STATIC = 0.6


def ridgefill_server_flags(model_dir, dtype: str, maps_dir, *, tail: int | None, longest: int,
                           split: int | None = None) -> list[str]:
    """Flags of a RidgeFill server on this CPU for prompts of up to ``longest`` tokens in one chunk (the demo's
    and ``bench --serve``'s); ``tail`` / ``split`` None: the policy's or the server's default."""
    flags = ["--model-path", str(model_dir), "--dtype", dtype, "--prefill-backend", "ridgefill",
             "--ridgefill-maps", str(maps_dir),
             "--chunked-prefill-size", str(max(8192, longest)), "--max-total-tokens", str(longest + 4096),
             "--mem-fraction-static", str(MEM_FRACTION_STATIC)]
    if tail is not None:
        flags += ["--ridgefill-tail", str(tail)]
    if split is not None:
        flags += ["--ridgefill-split", str(split)]
    return flags


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m sgl_ridgefill.cpu.launch_server FLAGS`` (or ``command FLAGS``) on a free local port.

    ``start`` returns at once, so several servers can start side by side; ``wait_ready`` blocks until
    ``/health`` answers 200; ``alive`` says whether the process still runs (a scheduler crash takes the
    whole server down); ``stop`` terminates it. ``env``: the server's whole environment (default: this
    process's, set up for CPU); ``command``: what runs instead of the CPU launcher
    (``[python, "-m", "sglang.launch_server"]`` on a GPU machine)."""

    def __init__(
        self, flags: list[str], *, log_path: pathlib.Path | None = None, env: dict | None = None,
        command: list[str] | None = None,
    ):
        self.flags = list(flags)
        self.command = command or [sys.executable, "-m", "sgl_ridgefill.cpu.launch_server"]
        self.log_path = log_path
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> ServerProcess:
        cmd = [*self.command, *self.flags, "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=self.env or cpu_environment(), stdout=self._log, stderr=subprocess.STDOUT)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 900) -> None:
        import requests

        deadline = time.time() + timeout
        while True:
            if not self.alive:
                where = f"; see {self.log_path}" if self.log_path else ""
                code = self.proc.returncode if self.proc is not None else None
                raise RuntimeError(f"the server exited with code {code} while starting{where}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"the server was not ready after {timeout:.0f} s")
            time.sleep(2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)
        if self.log_path and self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def running_server(
    flags: list[str], *, log_path: pathlib.Path | None = None, timeout: float = 900, env: dict | None = None,
    command: list[str] | None = None, on_start: Callable[[subprocess.Popen], None] | None = None,
):
    """Yield the base URL of a :class:`ServerProcess`; stop it afterwards. ``on_start``: called with the
    server process once it answers ``/health``."""
    server = ServerProcess(flags, log_path=log_path, env=env, command=command).start()
    try:
        server.wait_ready(timeout)
        if on_start is not None:
            on_start(server.proc)
        yield server.url
    finally:
        server.stop()
