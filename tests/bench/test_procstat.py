"""CPU accounting of a local server's processes (Linux ``/proc``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sgl_ridgefill.bench.procstat import ServerCpu, descendants
from sgl_ridgefill.bench.runner import Record

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

# Busy until it has used 0.3 CPU seconds (however loaded the machine is), then waits for stdin.
CHILD = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()\n"


def test_child_cpu_seconds_are_counted():
    probe = ServerCpu(os.getpid())
    before = probe.sample()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        assert child.pid in descendants(os.getpid())
        delta = ServerCpu.delta(before, probe.sample())
        (key,) = [k for k in delta if k.endswith(f"[{child.pid}]")]
        assert 0.29 <= delta[key] < 5.0
    finally:
        child.communicate("")


def test_missing_pid_is_a_user_error():
    with pytest.raises(ValueError, match=r"^--server-pid 999999999: no such process on this machine$"):
        ServerCpu(999_999_999)


def test_scheduler_cores_from_record():
    rec = Record(4096, 0, "exact", 0, 2.0, 0, {"sglang::schedul[5]": 3.0, "sglang::detokeni[6]": 0.1})
    assert rec.scheduler_cores == pytest.approx(1.5)
    assert Record(4096, 0, "exact", 0, 2.0, 0).scheduler_cores is None
