"""``bench.measures.cpu_seconds``: a broker's CPU to the nanosecond (so a benchmark of a few hundred milliseconds is
not rounded to 10 ms clock ticks), every thread counted, those that have ended too."""

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
def test_a_process_of_several_threads_is_read_finer_than_a_tick_too(spinner: subprocess.Popen[bytes]) -> None:
    readings = _readings(spinner.pid, 10)
    assert readings == sorted(readings)
    assert sum(_off_tick(r) for r in readings) >= 8, readings


ENDING_THREAD = """
import sys, threading, time
def spin():
    sys.stdin.readline()
    began = time.thread_time()
    while time.thread_time() - began < 0.5: pass
worker = threading.Thread(target=spin)
worker.start()
print("started", flush=True)
worker.join()
print("ended", flush=True)
time.sleep(60)
"""


def test_a_thread_that_ends_between_two_readings_is_counted() -> None:
    """A broker's worker threads come and go (trio's idle ones end after 10 s; logins, the journal's fsync): their
    time is counted whether the process has one thread or several at either reading."""
    command = [sys.executable, "-c", ENDING_THREAD]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdin is not None
            assert process.stdout is not None
            assert process.stdout.readline() == "started\n"
            before = cpu_seconds(process.pid)  # two threads, the second waiting for its go
            process.stdin.write("go\n")
            process.stdin.flush()
            assert process.stdout.readline() == "ended\n"  # one thread (the other joined)
            assert 0.45 <= cpu_seconds(process.pid) - before < 0.7
        finally:
            process.kill()


def test_a_finer_reading_agrees_with_the_ticks() -> None:
    """The nanosecond reading is the same CPU time as utime+stime (within a tick or two), not another clock."""
    spin_then_sleep = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
        "print('spun', flush=True)\ntime.sleep(60)"
    )
    with subprocess.Popen([sys.executable, "-c", spin_then_sleep], stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "spun\n"  # (its CPU time no longer moves)
            fine = cpu_seconds(process.pid)
            with open(f"/proc/{process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks = (int(fields[11]) + int(fields[12])) / CLK_TCK
            assert 0.5 <= fine < 1.0
            assert abs(fine - ticks) <= 0.025, (fine, ticks)
        finally:
            process.kill()


@pytest.mark.parametrize("spinner", ["import time\ntime.sleep(60)\n"], indirect=True)
def test_an_idle_process_settles_at_once(spinner: subprocess.Popen[bytes]) -> None:
    began = time.monotonic()
    settle_cpu(spinner.pid, quiet=0.1, limit=3.0)
    assert time.monotonic() - began < 1.0


SLOW_DRAIN = """
import time
while True:
    began = time.process_time()
    while time.process_time() - began < 0.002: pass
    time.sleep(0.02)
"""


@pytest.mark.parametrize("spinner", [SLOW_DRAIN], indirect=True)
def test_a_process_working_at_a_tenth_of_a_cpu_is_waited_for(spinner: subprocess.Popen[bytes]) -> None:
    """A broker handling a back-log slowly (2 ms of CPU every 20 ms) is not quiet: the wait runs to its limit."""
    began = time.monotonic()
    settle_cpu(spinner.pid, quiet=0.1, limit=0.6)
    assert time.monotonic() - began >= 0.6
