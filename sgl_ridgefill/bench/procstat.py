"""CPU seconds used by a local server's processes, from ``/proc`` (Linux only).

On a CPU server, wall time alone cannot tell a slow kernel from a starved one: ``cpu_seconds / wall``
per request says how many cores the scheduler process actually kept busy. On a shared machine CPU time
is also less disturbed by other people's jobs than wall time.
"""

from __future__ import annotations

import os
import pathlib

_PROC = pathlib.Path("/proc")


def _ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


def _stat_fields(path: pathlib.Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces; fields after it are plain.
    return text[text.rfind(")") + 2 :].split()


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), or ``None`` if it is gone."""
    fields = _stat_fields(_PROC / str(pid) / "stat")
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _ticks_per_second()


def process_name(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


class ServerCpu:
    """Samples the CPU seconds of a server (its launch ``pid`` and all children) by process name."""

    def __init__(self, pid: int):
        if not (_PROC / str(pid)).is_dir():
            raise ValueError(f"--server-pid {pid}: no such process on this machine")
        self.pid = pid

    def sample(self) -> dict[str, float]:
        """``{"<name>[<pid>]": cpu_seconds}`` for every live process of the server."""
        out = {}
        for p in descendants(self.pid):
            seconds = process_cpu_seconds(p)
            if seconds is not None:
                out[f"{process_name(p)}[{p}]"] = seconds
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before.get(k, 0.0), 3) for k in after}
