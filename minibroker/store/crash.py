"""Named crash points and hold points, for tests that must hit a precise moment.

    MINIBROKER_CRASH_AT=after-write:3 minibroker --data-dir d   # dies at the 3rd journal write

Crash points: ``after-write`` (a record is written, not yet fsynced), ``before-fsync``, ``after-fsync`` (the
record is durable, its ``accepted`` not yet sent). The process exits at once with status 86, like a crash:
no cleanup, no flush.

    mkfifo hold; MINIBROKER_HOLD_AT=recovery:hold minibroker --data-dir d --http-port 0 &
    exec 3>hold   # returns once recovery is held; the broker answers /readyz 503 until fd 3 is closed

Hold points (test-only; off unless the variable is set): ``recovery`` (the data dir is locked, no segment read
yet). The journal opens the named pipe ``PATH`` of ``MINIBROKER_HOLD_AT=POINT:PATH`` for reading and waits
for its end: the test's opening of the pipe for writing returns once the broker is there, and closing it lets
the broker go on. No sleeps, no polling. The variable is read when the point is reached (so a test may set it
in-process), the crash variable once at import.
"""

from __future__ import annotations

import os

CRASH_EXIT_STATUS = 86
_setting = os.environ.get("MINIBROKER_CRASH_AT", "")
_point, _, _count = _setting.partition(":")
_remaining = int(_count) if _count.isdigit() else 1
POINTS = ("after-write", "before-fsync", "after-fsync")
HOLD_POINTS = ("recovery",)


def crash_point(name: str) -> None:
    """Die here if ``MINIBROKER_CRASH_AT`` names this point and its count is reached."""
    global _remaining
    if _point != name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os._exit(CRASH_EXIT_STATUS)


def hold_point(name: str) -> None:
    """Wait here, if ``MINIBROKER_HOLD_AT`` is ``name:PATH``, until the writer of the named pipe PATH closes it."""
    point, _, path = os.environ.get("MINIBROKER_HOLD_AT", "").partition(":")
    if point != name or not path:
        return
    with open(path, "rb") as pipe:  # blocks until a writer opens it
        while pipe.read(4096):  # until the writer closes it
            pass
