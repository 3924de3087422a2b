"""The soak's sequential phase empties the radix cache before each request, as the benchmark does."""

from __future__ import annotations

import socket

from sgl_ridgefill.soak import run as soak_run

from ..bench.fake_server import FakeServer


def test_flush_waits_out_a_busy_server_and_reports_one_that_is_gone():
    with FakeServer("m", exact_s=0.0, ridgefill_s=0.0) as fake:
        fake.busy_flushes = 2  # refused (HTTP 400) while the last request leaves its batch
        assert soak_run._flush(fake.url) is True
        assert [e[0] for e in fake.log] == ["flush refused", "flush refused", "flush"]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert soak_run._flush(url) is False
