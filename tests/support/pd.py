"""Prefill/decode disaggregation on CPU for tests: a prefill and a decode server, and a client in place of
SGLang's router (none ships with SGLang 0.5.23).

The client posts the same ``/generate`` body to both servers at once, adding ``bootstrap_host``,
``bootstrap_port`` and a fresh ``bootstrap_room``, and returns the decode server's answer. Everything binds
to and talks to 127.0.0.1.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import pathlib

import requests

from sgl_ridgefill.cpu.launch_server_process import free_port
from tests.support.server import cpu_server

HOST = "127.0.0.1"


def mooncake_available() -> str | None:
    """Why the Mooncake transfer engine cannot run here, or ``None``."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as e:
        return f"mooncake-transfer-engine-non-cuda is not usable ({e}); pip install -e .[pd] and apt-get install libibverbs1"
    return None


class PDClient:
    """``generate(body)``: one request through the prefill and the decode server."""

    def __init__(self, prefill_url: str, decode_url: str, bootstrap_port: int):
        self.prefill_url, self.decode_url, self.bootstrap_port = prefill_url, decode_url, bootstrap_port
        self._rooms = itertools.count(1 + os.getpid() % 1000 * 100000)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)

    def generate(self, body: dict, timeout: float = 600) -> requests.Response:
        """The decode server's answer (the prefill server's when only that one failed)."""
        p, d = self.generate_both(body, timeout)
        return p if p.status_code != 200 and d.status_code == 200 else d

    def generate_both(self, body: dict, timeout: float = 600) -> tuple[requests.Response, requests.Response]:
        """The prefill and the decode server's answers to one request."""
        body = dict(body, bootstrap_host=HOST, bootstrap_port=self.bootstrap_port, bootstrap_room=next(self._rooms))
        prefill = self._pool.submit(requests.post, self.prefill_url + "/generate", json=body, timeout=timeout)
        decode = self._pool.submit(requests.post, self.decode_url + "/generate", json=body, timeout=timeout)
        return prefill.result(), decode.result()


@contextlib.contextmanager
def pd_servers(prefill_args: list[str], decode_args: list[str], env: dict | None = None,
               prefill_env: dict | None = None, log_dir: pathlib.Path | None = None):
    """Start a prefill and a decode server (CPU launcher, Mooncake over TCP on 127.0.0.1); yield a
    :class:`PDClient`. ``env``: variables for both; ``prefill_env``: for the prefill server only."""
    bootstrap = free_port()
    common = dict(env or {})
    log = (lambda name: str(log_dir / name)) if log_dir is not None else (lambda name: None)
    prefill = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap), *prefill_args]
    decode = ["--disaggregation-mode", "decode", *decode_args]
    with cpu_server(prefill, {**common, **(prefill_env or {})}, log_path=log("prefill.log")) as p_url:
        with cpu_server(decode, common, log_path=log("decode.log")) as d_url:
            yield PDClient(p_url, d_url, bootstrap)
