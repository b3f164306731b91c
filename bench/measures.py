"""Figures about a process, read from /proc/PID or ``getrusage``, and the statistics the benchmarks report.

Nothing here imports minibroker: tests/crash/workload.py, which starts quickly, may import this package.
"""

from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time process ``pid`` (all its threads) has used; OSError once it is gone.

    A process of one thread is read to the nanosecond (its run time in ``/proc/PID/schedstat``); one of several
    threads in clock ticks (``utime + stime`` of ``/proc/PID/stat``, 10 ms here, which counts the threads that have
    ended too): a figure of a few hundred milliseconds would otherwise be off by up to a tenth.
    """
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[17] == "1":  # num_threads (field 20 of stat)
        try:
            return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            pass  # a kernel without schedstat: the ticks below
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def cpu_seconds_or_none(pid: int | None) -> float | None:
    """``cpu_seconds(pid)``, or None without a pid or once the process is gone."""
    if pid is None:
        return None
    try:
        return cpu_seconds(pid)
    except OSError:
        return None


def self_cpu_seconds() -> float:
    """User plus system CPU time of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS)."""
    return _status_kib(pid, "VmRSS:")


def peak_rss_kib(pid: int) -> int:
    """Peak resident set size of ``pid`` in KiB (VmHWM)."""
    return _status_kib(pid, "VmHWM:")


def open_fds(pid: int) -> tuple[int, int]:
    """(open file descriptors, of which sockets) of ``pid``."""
    total = sockets = 0
    for entry in os.scandir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue  # closed meanwhile
        total += 1
        sockets += target.startswith("socket:")
    return total, sockets


def settle_cpu(pid: int | None, quiet: float = 0.2, limit: float = 5.0) -> None:
    """Wait until process ``pid`` has used no CPU for ``quiet`` seconds (its back-log handled), at most
    ``limit`` seconds; without a pid, just ``quiet`` seconds."""
    if pid is None:
        time.sleep(quiet)
        return
    deadline = time.monotonic() + limit
    last = cpu_seconds_or_none(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu_seconds_or_none(pid)
        if now is None or last is None or now - last < 0.001:  # (a timer's wake-up is not a back-log)
            return
        last = now


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``samples``: the nearest sample by rank."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def callgrind_instructions(stderr: str) -> int:
    """The instructions ``valgrind --tool=callgrind`` counted, from its report on stderr; ``RuntimeError`` (with
    the report's end) when it has none."""
    match = re.search(r"Collected : (\d+)", stderr)
    if match is None:
        raise RuntimeError(f"no instruction count from callgrind: {stderr[-500:]}")
    return int(match.group(1))
