"""A full or failing disk under the journal (store/journal.py), through its ``FileOps`` seam: short writes are
continued, a failed write leaves no half record and nothing in the state, a failed fsync is made good by
``repair``, compaction on a full disk keeps the old segments, and after a restart exactly what was appended
(and so could have been acknowledged) is there, with no torn tail.

Issue 12, item 9 (journal side; tests/server/test_disk_full.py drives a running broker).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from minibroker.store.journal import FileOps, Journal, JournalUnavailable
from minibroker.store.records import Kind, Op

QUEUE = ("default", "queue", "orders")


class Disk(FileOps):
    """Real files, with failures on demand: ``room`` bytes left (then ENOSPC or ``error``), writes cut to
    ``short`` bytes, failing fsyncs that (as Linux may) lose what they were to write, failing truncates."""

    def __init__(self) -> None:
        self.room: int | None = None
        self.error = errno.ENOSPC
        self.short: int | None = None
        self.fsync_fails = False
        self.truncate_fails = False
        self.synced_size: dict[int, int] = {}

    def write(self, fd: int, data: memoryview) -> int:
        if self.short is not None:
            data = data[: self.short]
        if self.room is not None:
            if self.room <= 0:
                raise OSError(self.error, os.strerror(self.error))
            data = data[: self.room]
            self.room -= len(data)
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsync_fails:
            # the pages that failed to reach the disk are dropped: the file ends where the last fsync left it
            os.ftruncate(fd, self.synced_size.get(fd, os.fstat(fd).st_size))
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)
        self.synced_size[fd] = os.fstat(fd).st_size

    def ftruncate(self, fd: int, size: int) -> None:
        if self.truncate_fails:
            raise OSError(errno.EIO, "Input/output error")
        os.ftruncate(fd, size)


def _journal(path: Path, disk: Disk | None = None, **kwargs: Any) -> Journal:
    journal = Journal(path, ops=disk, **kwargs)
    journal.recover()
    return journal


def enqueue(i: int, payload: bytes = b"m" * 50) -> list[Op]:
    return [Op(Kind.ENQUEUE, QUEUE, i, 0, payload)]


def _restarted(path: Path) -> list[int]:
    journal = _journal(path)
    try:
        assert journal.quarantined == [], "a half-written record was found"
        return sorted(journal.state.messages.get(QUEUE, {}))
    finally:
        journal.close()


def test_short_writes_are_continued(tmp_path: Path) -> None:
    disk = Disk()
    journal = _journal(tmp_path, disk)
    disk.short = 7
    for i in range(1, 21):
        journal.append(enqueue(i, os.urandom(100)))
    journal.sync()
    journal.close()
    assert _restarted(tmp_path) == list(range(1, 21))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_a_failed_write_leaves_nothing_and_refuses_until_repaired(tmp_path: Path, code: int) -> None:
    disk = Disk()
    journal = _journal(tmp_path, disk)
    for i in range(1, 6):
        journal.append(enqueue(i))
    journal.sync()
    size = journal.segments()[-1].stat().st_size
    disk.room, disk.error = 30, code  # a part of the next record fits, then the disk is full
    with pytest.raises(JournalUnavailable):
        journal.append(enqueue(6))
    assert journal.segments()[-1].stat().st_size == size  # no half record
    assert sorted(journal.state.messages[QUEUE]) == [1, 2, 3, 4, 5]  # nothing of it applied
    assert not journal.writable
    disk.room = 10_000
    with pytest.raises(JournalUnavailable):
        journal.append(enqueue(7))  # refused until repaired, even though it would fit
    disk.room = 0
    with pytest.raises(JournalUnavailable):
        journal.repair()  # still full: the probe does not fit
    assert journal.segments()[-1].stat().st_size == size
    disk.room = None  # space is back
    journal.repair()
    assert journal.writable
    journal.append(enqueue(8))
    journal.sync()
    journal.close()
    assert _restarted(tmp_path) == [1, 2, 3, 4, 5, 8]


def test_a_half_record_that_could_not_be_truncated_is_cut_by_repair(tmp_path: Path) -> None:
    disk = Disk()
    journal = _journal(tmp_path, disk)
    journal.append(enqueue(1))
    size = journal.segments()[-1].stat().st_size
    disk.room, disk.truncate_fails = 20, True
    with pytest.raises(JournalUnavailable):
        journal.append(enqueue(2))
    assert journal.segments()[-1].stat().st_size == size + 20  # the half record is still there
    disk.room = None
    with pytest.raises(JournalUnavailable):
        journal.repair()
    disk.truncate_fails = False
    journal.repair()
    assert journal.segments()[-1].stat().st_size == size
    journal.append(enqueue(3))
    journal.close()
    assert _restarted(tmp_path) == [1, 3]


def test_a_failed_fsync_is_made_good_by_rewriting(tmp_path: Path) -> None:
    """An fsync that fails may have lost the records it was to write (Linux drops the pages): ``repair``
    rewrites them from memory, and only then are they synced (and their answers may go)."""
    disk = Disk()
    journal = _journal(tmp_path, disk)
    journal.append(enqueue(1))
    assert journal.sync() == 1
    journal.append(enqueue(2))
    journal.append(enqueue(3))
    disk.fsync_fails = True
    with pytest.raises(JournalUnavailable):
        journal.sync()
    assert journal.synced == 1  # 2 and 3 were not acknowledged
    with pytest.raises(JournalUnavailable):
        journal.append(enqueue(4))
    with pytest.raises(JournalUnavailable):
        journal.repair()
    disk.fsync_fails = False
    journal.repair()
    assert journal.synced == journal.appended == 3
    journal.append(enqueue(5))
    journal.close()
    assert _restarted(tmp_path) == [1, 2, 3, 5]


def test_compaction_on_a_full_disk_keeps_the_old_segments(tmp_path: Path) -> None:
    disk = Disk()
    journal = _journal(tmp_path, disk, compact_at=1)
    for i in range(1, 101):
        journal.append(enqueue(i))
        if i % 10:
            journal.append([Op(Kind.SETTLE, QUEUE, i)])
    journal.sync()
    before = {p.name: p.read_bytes() for p in journal.segments()}
    assert journal.needs_compaction()
    disk.room = 200  # the snapshot does not fit
    assert journal.compact() is False
    assert {p.name: p.read_bytes() for p in journal.segments()} == before
    assert not list(tmp_path.glob("*.tmp"))
    assert journal.writable  # appending goes on in the old segment
    assert not journal.needs_compaction()  # not tried again at once
    disk.room = None
    for i in range(101, 141):
        journal.append(enqueue(i))
        journal.append([Op(Kind.SETTLE, QUEUE, i)])
    assert journal.needs_compaction()  # the journal grew by another quarter
    assert journal.compact() is True
    assert len(journal.segments()) == 1
    journal.close()
    assert _restarted(tmp_path) == list(range(10, 101, 10))


def test_a_failed_directory_fsync_after_compaction_holds_appends_until_repaired(tmp_path: Path) -> None:
    """Once the snapshot is renamed in, appends go to it; if its directory entry may not be durable yet, no
    append is acknowledged until a directory fsync succeeds."""

    class DirectoryFails(Disk):
        fail_directory = False

        def fsync(self, fd: int) -> None:
            if self.fail_directory and os.path.isdir(f"/proc/self/fd/{fd}"):
                raise OSError(errno.EIO, "Input/output error")
            super().fsync(fd)

    disk = DirectoryFails()
    journal = _journal(tmp_path, disk, compact_at=1)
    for i in range(1, 11):
        journal.append(enqueue(i))
    disk.fail_directory = True
    with pytest.raises(JournalUnavailable):  # the writer learns it, logs it and repairs
        journal.compact()
    assert len(list(tmp_path.glob("journal-*.log"))) == 2  # the old segment is kept
    with pytest.raises(JournalUnavailable):
        journal.append(enqueue(11))
    disk.fail_directory = False
    journal.repair()
    journal.append(enqueue(12))
    journal.close()
    assert _restarted(tmp_path) == [*range(1, 11), 12]
    assert len(list(tmp_path.glob("journal-*.log"))) == 1
