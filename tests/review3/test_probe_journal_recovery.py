"""Probes of recovery (store/journal.py): one flipped byte or bit must never lose acknowledged records silently,
--recover=skip-corrupt must leave a journal that starts again without it, a segment that cannot be read is a data
dir error, and the data-dir lock must hold even when its lock file is deleted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from minibroker.store.journal import DataDirError, Journal, JournalCorrupt, JournalError, record_offsets
from minibroker.store.records import Kind, Op

QUEUE = ("default", "queue", "orders")


def subscription(n: int) -> tuple[str, ...]:
    return ("default", "subscription", "news", "c", f"s{n}")


def _fill(path: Path, count: int = 50) -> None:
    journal = Journal(path)
    journal.recover()
    for i in range(1, count + 1):
        journal.append([Op(Kind.ENQUEUE, QUEUE, i, 0, b"m" * 100)])
    journal.sync()
    journal.close()


def _flip(segment: Path, offset: int, mask: int = 1) -> None:
    data = bytearray(segment.read_bytes())
    data[offset] ^= mask
    segment.write_bytes(bytes(data))


def _start(path: Path, recover: str = "strict") -> list[int]:
    journal = Journal(path, recover=recover)
    try:
        state = journal.recover()
        return sorted(state.messages.get(QUEUE, {}))
    finally:
        journal.close()


def test_a_flipped_byte_in_the_segment_magic_is_not_a_torn_tail(tmp_path: Path) -> None:
    """The segment is then read as one of the first format, every record fails, and the whole segment (all 50
    acknowledged messages) is cut as a "torn tail ... never acknowledged"."""
    _fill(tmp_path)
    (segment,) = tmp_path.glob("journal-*.log")
    _flip(segment, 0)
    try:
        recovered = _start(tmp_path)
    except JournalError:
        return  # refusing to start is right
    assert recovered == list(range(1, 51)), f"{50 - len(recovered)} acknowledged messages lost at start"


def _compacted_with_snapshot_end_flipped(path: Path, *, record_after: bool) -> None:
    journal = Journal(path, compact_at=1)
    journal.recover()
    for i in range(1, 51):
        journal.append([Op(Kind.ENQUEUE, QUEUE, i, 0, b"m" * 100)])
    for i in range(1, 41):
        journal.append([Op(Kind.SETTLE, QUEUE, i)])
    journal.sync()
    assert journal.compact()
    if record_after:
        journal.append([Op(Kind.ENQUEUE, QUEUE, 51, 0, b"after the compaction")])
    journal.sync()
    journal.close()
    (segment,) = path.glob("journal-*.log")
    _, end, _ = next(r for r in record_offsets(segment) if r[2] is Kind.SNAPSHOT_END)
    _flip(segment, end - 1)


def test_a_damaged_snapshot_end_at_the_tail_does_not_lose_the_journal_at_the_next_start(tmp_path: Path) -> None:
    """1st start: SNAPSHOT_END is cut as a torn tail. 2nd start: the segment is an "incomplete snapshot that never
    became the journal", moved to quarantine: the broker starts empty."""
    _compacted_with_snapshot_end_flipped(tmp_path, record_after=False)
    runs = []
    for _ in range(2):
        try:
            runs.append(_start(tmp_path))
        except JournalError:
            return  # refusing to start is right
    assert runs[1] == list(range(41, 51)), f"second start: {runs[1]}"


def test_skip_corrupt_then_a_strict_start_keeps_the_journal(tmp_path: Path) -> None:
    """skip-corrupt drops the damaged SNAPSHOT_END; the next (strict) start then takes the whole segment for an
    incomplete snapshot and throws it away."""
    _compacted_with_snapshot_end_flipped(tmp_path, record_after=True)
    with pytest.raises(JournalCorrupt):
        _start(tmp_path)
    assert _start(tmp_path, "skip-corrupt") == [*range(41, 51), 51]
    assert _start(tmp_path) == [*range(41, 51), 51]


def test_after_skip_corrupt_a_strict_start_works(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a compaction a payload shared by several subscriptions is written once (ENQUEUE) and referred to by
    later records (ENQUEUE_REF). skip-corrupt drops a damaged ENQUEUE but keeps the references to it, so every
    later strict start refuses again ("refers to payload ..., not in the journal")."""
    journal = Journal(tmp_path, compact_at=1)
    journal.recover()
    journal.append([Op(Kind.SUBSCRIBE, subscription(i)) for i in range(3)])
    payload = b"P" * 200
    journal.append([Op(Kind.ENQUEUE, subscription(i), 10 + i, 0, payload) for i in range(3)])
    journal.append([Op(Kind.ENQUEUE, QUEUE, 100, 0, b"kept")])
    journal.sync()
    assert journal.compact()
    journal.close()
    (segment,) = tmp_path.glob("journal-*.log")
    _, end, _ = next(r for r in record_offsets(segment) if r[2] is Kind.ENQUEUE)
    _flip(segment, end - 5)
    with pytest.raises(JournalCorrupt):
        _start(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert _start(tmp_path, "skip-corrupt") == [100]
    assert _start(tmp_path) == [100]  # the journal skip-corrupt left must start as it is


def test_a_segment_that_cannot_be_read_is_a_data_dir_error(tmp_path: Path) -> None:
    """(The command line turns any other OSError into "cannot listen on HOST:PORT: [Errno 21] Is a directory".)"""
    (tmp_path / "journal-00000001.log").mkdir()
    with pytest.raises(DataDirError):
        Journal(tmp_path).recover()


def test_the_lock_holds_when_the_lock_file_is_deleted(tmp_path: Path) -> None:
    """An operator (or a clean-up script) removing a "stale" minibroker.lock lets a second broker in."""
    first = Journal(tmp_path)
    first.recover()
    try:
        (tmp_path / "minibroker.lock").unlink()
        second = Journal(tmp_path)
        try:
            with pytest.raises(DataDirError):
                second.recover()
        finally:
            second.close()
    finally:
        first.close()
