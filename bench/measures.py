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
    """User plus system CPU time process ``pid`` (all its threads, those that have ended too) has used, to the
    nanosecond; OSError once it is gone.

    Read from the process's CPU-time clock (``clock_getcpuclockid``, built here: Python has no such call), the
    figure ``utime + stime`` of ``/proc/PID/stat`` rounds to clock ticks (10 ms here, up to a tenth of a figure
    of a few hundred milliseconds). Not ``/proc/PID/schedstat``: that is the main thread's alone, so a worker
    thread of the broker (logins, the journal's fsync; trio ends an idle one after 10 s) would be counted at one
    reading and not at the next.
    """
    return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) of linux/posix-timers.h


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
