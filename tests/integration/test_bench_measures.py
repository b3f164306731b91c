"""``bench.measures.cpu_seconds``: a broker's CPU read from /proc, to the nanosecond while it runs one thread (so a
benchmark of a few hundred milliseconds is not rounded to 10 ms clock ticks), in ticks once it runs several (so the
time of threads that have ended is still counted)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.measures import CLK_TCK, cpu_seconds, settle_cpu

SPIN = "while True: pass\n"
THREADED_SPIN = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n" + SPIN


@pytest.fixture
def spinner(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", request.param])
    try:
        time.sleep(0.3)
        yield process
    finally:
        process.kill()
        process.wait()


def _readings(pid: int, count: int) -> list[float]:
    readings = []
    for _ in range(count):
        readings.append(cpu_seconds(pid))
        time.sleep(0.013)  # (not a multiple of the tick)
    return readings


def _off_tick(value: float) -> bool:
    ticks = value * CLK_TCK
    return abs(ticks - round(ticks)) > 1e-6


@pytest.mark.parametrize("spinner", [SPIN], indirect=True)
def test_a_single_threaded_process_is_read_finer_than_a_tick(spinner: subprocess.Popen[bytes]) -> None:
    readings = _readings(spinner.pid, 10)
    assert readings == sorted(readings)
    assert readings[-1] > readings[0]
    assert sum(_off_tick(r) for r in readings) >= 8, readings  # ticks would make every reading a multiple of 10 ms


@pytest.mark.parametrize("spinner", [THREADED_SPIN], indirect=True)
def test_a_process_of_several_threads_is_read_in_ticks(spinner: subprocess.Popen[bytes]) -> None:
    readings = _readings(spinner.pid, 5)
    assert readings[-1] > readings[0]
    assert not any(_off_tick(r) for r in readings), readings


def test_a_finer_reading_agrees_with_the_ticks() -> None:
    """The nanosecond reading is the same CPU time as utime+stime (within a tick or two), not another clock."""
    spin_then_sleep = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ntime.sleep(60)"
    process = subprocess.Popen([sys.executable, "-c", spin_then_sleep])
    try:
        time.sleep(1.0)
        fine = cpu_seconds(process.pid)
        with open(f"/proc/{process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / CLK_TCK
        assert 0.5 <= fine < 1.0
        assert abs(fine - ticks) <= 0.025, (fine, ticks)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("spinner", ["import time\ntime.sleep(60)\n"], indirect=True)
def test_an_idle_process_settles_at_once(spinner: subprocess.Popen[bytes]) -> None:
    began = time.monotonic()
    settle_cpu(spinner.pid, quiet=0.1, limit=3.0)
    assert time.monotonic() - began < 1.0
