"""Named crash points, for crash tests that must hit a precise moment (``MINIBROKER_CRASH_AT``).

    MINIBROKER_CRASH_AT=after-write:3 minibroker --data-dir d   # dies at the 3rd journal write

Points: ``after-write`` (a record is written, not yet fsynced), ``before-fsync``, ``after-fsync`` (the
record is durable, its ``accepted`` not yet sent). The process exits at once with status 86, like a crash:
no cleanup, no flush.
"""

from __future__ import annotations

import os

CRASH_EXIT_STATUS = 86
_setting = os.environ.get("MINIBROKER_CRASH_AT", "")
_point, _, _count = _setting.partition(":")
_remaining = int(_count) if _count.isdigit() else 1
POINTS = ("after-write", "before-fsync", "after-fsync")


def crash_point(name: str) -> None:
    """Die here if ``MINIBROKER_CRASH_AT`` names this point and its count is reached."""
    global _remaining
    if _point != name:
        return
    _remaining -= 1
    if _remaining <= 0:
        os._exit(CRASH_EXIT_STATUS)
