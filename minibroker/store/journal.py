"""An append-only journal of durable broker state: torn tails told from corruption, shared payloads, a lock on
its directory, write failures survived, and crash-safe compaction.

Theory of operation
-------------------
The journal is a sequence of segment files ``journal-NNNNNNNN.log`` in the data directory, which a broker
holds with an exclusive lock (on the directory itself and on ``minibroker.lock``, which holds the holder's pid)
for as long as it runs. A segment is a header and records, in the format of ``store/records.py``; what the
records add up to is a ``DurableState`` (``store/state.py``), which the journal keeps up to date as it appends
(a payload shared by several nodes is kept once while any message holds it).

Appending writes to the current segment at once (the operating system's cache), looping over short writes;
``sync()`` fsyncs it. Callers that promise durability (an ``accepted`` sent to a client) wait for a sync that
covers their record. A write or fsync that fails (disk full, quota, I/O error) raises ``JournalUnavailable``
and leaves the journal *failed*: the segment is cut back to its last complete record, nothing of the record
is applied to the state, and every later append is refused until ``repair()`` succeeds. ``repair()`` cuts the
segment back again, rewrites the records an fsync failure may have lost (their bytes are kept until a sync
covers them), and checks that a probe record can be written and fsynced. All file I/O goes through
``FileOps``, which a test replaces to inject failures.

Recovery reads every segment. An incomplete last record at the end of the last segment is a *torn tail* (a
crash while writing): it is cut off, with a log line, after its bytes are kept in ``quarantine/``; bad bytes at
the start of a segment never are (a segment without the magic is read as one of the first format only while no
segment of this format comes before it and its first bytes are not a damaged header). A record
that does not check out with valid records after it (in the segment or in a later one) is *corruption*:
recovery refuses (``JournalCorrupt``, naming the segment and the byte offset) and changes nothing, unless
``recover="skip-corrupt"``: then a copy of the segment goes to ``quarantine/`` first, and the segment is
rewritten without the bad bytes; records that refer to a skipped payload are skipped too, and then the journal
is rewritten as a snapshot of what was recovered (so that the next strict start finds nothing to skip).

Compaction writes the live state into a fresh segment that starts with a SNAPSHOT record and ends with a
SNAPSHOT_END record, fsyncs it, then deletes the older segments. The state is captured first
(``begin_compaction``), the snapshot written from the capture (``write_snapshot``: the I/O layer runs it in a
worker thread while records go on being appended to the current segment), then the records appended meanwhile
are written after it and it replaces the old segments (``finish_compaction``). Recovery starts from the newest segment
whose snapshot is complete, so a crash at any moment of compaction loses nothing and replays nothing twice (a
snapshot without its end is ignored while older segments are there; once they are gone, it is the journal).
A compaction that cannot be written (disk full) is abandoned: its file is removed, the old segments stay.

This module does the file I/O and nothing else: no trio, no clock (the format and the state are pure modules).
Nothing here needs more than O(1) work per operation to decide on compaction: the live size is kept up to date
as records are applied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from minibroker.store import RECOVER_MODES, records
from minibroker.store.crash import hold_point
from minibroker.store.records import (
    HEADER,
    MAGIC,
    RECORD_HEAD,
    SYNC,
    VERSION,
    CorruptRecord,
    Kind,
    Op,
    Record,
    damaged_header,
    decode_ops,
    encode_ops,
    encode_record,
    next_valid,
    record_at,
    segment_header,
)
from minibroker.store.state import Capture, DurableState, snapshot_ops

log = logging.getLogger("minibroker.store")

_SEGMENT = "journal-{:08d}.log"
LOCK_FILE = "minibroker.lock"
QUARANTINE = "quarantine"
_PROBE = 4096  # bytes of the probe record ``repair`` writes to check there is room again
_COMPACT_GROWTH = 3  # after a compaction, not again before the segment is this many times its snapshot


# -- errors ---------------------------------------------------------------------------------------------
class JournalError(Exception):
    """The journal cannot be used; the message says why (and the command line exits 2 with it)."""


class DataDirError(JournalError):
    """The data directory is unusable: not a directory, not writable, or held by another broker."""


class JournalCorrupt(JournalError):
    """Recovery found corruption (not a torn tail): bad data followed by valid records."""

    def __init__(self, path: Path, offset: int, reason: str, count: int = 1) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        more = f" (and {count - 1} more corrupt place(s))" if count > 1 else ""
        super().__init__(
            f"journal {path} is corrupt at byte {offset}: {reason}{more}; nothing was changed. Start with "
            f"--recover=skip-corrupt to skip the corrupt record(s) (a copy of the segment is kept in "
            f"{path.parent / QUARANTINE})"
        )


class JournalUnavailable(JournalError):
    """A write or fsync failed (disk full, quota, I/O error): the journal takes nothing until ``repair()``."""


class RecordTooLarge(JournalError):
    """A record larger than recovery reads back (``records.MAX_RECORD``): not written, nothing applied."""


class FileOps:
    """The journal's file I/O, one method per system call: a test replaces one to inject a failure."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def rename(self, source: Path, target: Path) -> None:
        os.rename(source, target)

    def unlink(self, path: Path) -> None:
        os.unlink(path)


class IoCounts:
    """Bytes written and fsyncs done through a journal's ``FileOps`` since it was made (records, segment headers,
    snapshots, repairs; recovery's own cuts and copies are not counted). Counted under a lock: a worker thread
    writes snapshots and fsyncs while the broker's thread appends."""

    __slots__ = ("_bytes", "_fsyncs", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = 0
        self._fsyncs = 0

    def wrote(self, count: int) -> None:
        with self._lock:
            self._bytes += count

    def synced(self) -> None:
        with self._lock:
            self._fsyncs += 1

    @property
    def bytes_written(self) -> int:
        return self._bytes

    @property
    def fsyncs(self) -> int:
        return self._fsyncs


@dataclass
class Compaction:
    """A compaction under way (``Journal.begin_compaction``): its snapshot is written by ``write_snapshot`` (in a
    worker thread), the records appended meanwhile go after it (``finish_compaction``)."""

    number: int
    salt: bytes
    old: list[Path]
    capture: Capture
    tmp: Path
    tail: list[list[Op]] = field(default_factory=list)
    fd: int | None = None
    size: int = 0
    error: OSError | None = None


# -- reading segments -------------------------------------------------------------------------------------
@dataclass
class _Bad:
    """Bytes of a segment that are not valid records: ``offset`` up to ``resume`` (None: to the end)."""

    offset: int
    resume: int | None
    reason: str


@dataclass
class _Segment:
    path: Path
    data: bytes
    salt: bytes | None  # None: a headerless segment of the first format
    start: int  # where records start (after the header)
    records: list[Record] = field(default_factory=list)
    bad: list[_Bad] = field(default_factory=list)

    @property
    def number(self) -> int:
        return int(self.path.name.split("-")[1].split(".")[0])

    @property
    def torn(self) -> _Bad | None:
        """The bad bytes at the end with no valid record after them in this segment, if any."""
        return self.bad[-1] if self.bad and self.bad[-1].resume is None else None

    @property
    def complete_snapshot(self) -> bool:
        return (
            bool(self.records)
            and self.records[0].kind is Kind.SNAPSHOT
            and any(r.kind is Kind.SNAPSHOT_END for r in self.records)
        )

    @property
    def incomplete_snapshot(self) -> bool:
        """A snapshot without its end, nothing damaged before its torn tail (if any): one whose writing stopped."""
        return (
            bool(self.records)
            and self.records[0].kind is Kind.SNAPSHOT
            and not self.complete_snapshot
            and all(b.resume is None and b.offset > 0 for b in self.bad)
        )

    @property
    def header_damaged(self) -> bool:
        return bool(self.bad) and self.bad[0].offset == 0 and self.salt is not None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataDirError(f"cannot read journal segment {path} ({exc.strerror or exc})") from None


def _scan(path: Path, *, legacy: bool = True) -> _Segment:
    """Read a segment: its records, and where its bytes are not valid records.

    A segment without the magic is one of the first format only when ``legacy`` (no segment of this format comes
    before it) and its first bytes are not a damaged header of this format; otherwise its header is damaged."""
    data = _read(path)
    if data[: len(MAGIC)] != MAGIC and (not legacy or damaged_header(data)):
        salt = data[8:16] if len(data) >= HEADER.size else b"\x00" * 8
        segment = _Segment(path, data, salt, min(len(data), HEADER.size))
        segment.bad.append(_Bad(0, segment.start if len(data) > HEADER.size else None, "a damaged segment header"))
    elif data[: len(MAGIC)] == MAGIC:
        if len(data) < HEADER.size:
            segment = _Segment(path, data, b"\x00" * 8, len(data))
            segment.bad.append(_Bad(0, None, "an incomplete segment header"))
            return segment
        _, version, salt, crc = HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise JournalError(
                f"journal {path} has format version {version}, which this minibroker cannot read (a newer one wrote it)"
            )
        segment = _Segment(path, data, salt, HEADER.size)
        if zlib.crc32(data[:16]) != crc:
            # the salt may be damaged too: records will tell (with a bad salt none checks out)
            segment.bad.append(_Bad(0, HEADER.size, "a bad segment header checksum"))
    else:
        segment = _Segment(path, data, None, 0)
    pos = segment.start
    salt_of = segment.salt
    view = memoryview(data)
    while pos < len(data):
        found = record_at(view, pos, salt_of)
        if isinstance(found, Record):
            segment.records.append(found)
            pos = found.end
            continue
        resume = next_valid(data, pos + 1, salt_of)
        segment.bad.append(_Bad(pos, resume, found))
        if resume is None:
            break
        pos = resume
    return segment


def record_offsets(path: str | Path) -> list[tuple[int, int, Kind]]:
    """(offset, end, kind) of each valid record of a segment file, in order (for tests and tools)."""
    return [(r.offset, r.end, r.kind) for r in _scan(Path(path)).records]


# -- the journal ------------------------------------------------------------------------------------------


class Journal:
    """The journal in ``directory``: lock it, recover it, append to it, sync it, repair it, compact it."""

    def __init__(
        self,
        directory: str | Path,
        *,
        sync: bool = True,
        compact_at: int = 64 << 20,
        recover: str = "strict",
        ops: FileOps | None = None,
    ) -> None:
        if recover not in RECOVER_MODES:
            raise ValueError(f"recover must be one of {', '.join(RECOVER_MODES)}")
        self.directory = Path(directory)
        self.sync_enabled = sync
        self.compact_at = compact_at
        self.skip_corrupt = recover == "skip-corrupt"
        self.ops = ops or FileOps()
        self.state = DurableState()
        self.error: OSError | None = None
        """Why the journal takes nothing now (a failed write or fsync); None while it works."""
        self._file: int | None = None
        self._lock: tuple[int, int] | None = None  # the data dir's fd and the lock file's, both locked
        self._segment = 0
        self._salt = b""
        self._written = 0  # bytes of complete records (and header) in the current segment
        self._synced_offset = 0  # bytes of the current segment covered by the last successful fsync
        self._unsynced: deque[tuple[int, bytes]] = deque()  # records a failed fsync may have lost
        self._resync = False  # an fsync failed: rewrite what follows ``_synced_offset`` before going on
        self._directory_unsynced = False
        self._compact_floor = 0
        self._shared: tuple[bytes, int] | None = None  # the last payload written, and its id
        self._compaction: Compaction | None = None  # a compaction under way
        self.appended = 0  # records appended since start (positions handed out)
        self._tail = (0, 0)  # (appended, _written) of the last append
        self.synced = 0  # records known to be on disk
        self.dropped_bytes = 0  # torn or corrupt bytes cut off or skipped at recovery
        self.quarantined: list[Path] = []  # copies kept at recovery, before anything was cut or skipped
        self.io = IoCounts()
        """Bytes written and fsyncs done (for metrics)."""

    # -- the directory ------------------------------------------------------------------------------------
    def _take_directory(self) -> None:
        """Check that the data dir is a writable directory and lock it (one broker per data dir)."""
        directory = self.directory
        if directory.exists() and not directory.is_dir():
            raise DataDirError(f"data dir {directory} is not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise DataDirError(f"data dir {directory} is not a directory (a parent of it is a file)") from None
        except OSError as exc:
            raise DataDirError(f"cannot create data dir {directory}: {exc.strerror or exc}") from None
        lock_path = directory / LOCK_FILE
        try:
            directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise DataDirError(f"cannot open data dir {directory} ({exc.strerror or exc})") from None
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            os.close(directory_fd)
            raise DataDirError(f"data dir {directory} is not writable ({exc.strerror or exc})") from None
        # the directory itself is locked (deleting the lock file does not let a second broker in), and the lock
        # file too (it holds the pid named to a second broker)
        for locked in (directory_fd, fd):
            try:
                fcntl.flock(locked, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_holder(fd)
                os.close(fd)
                os.close(directory_fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise DataDirError(
                        f"data dir {directory} is in use by another minibroker (pid {holder}); one broker per data dir"
                    ) from None
                raise DataDirError(f"cannot lock data dir {directory} ({exc.strerror or exc})") from None
        probe = directory / f".write-test-{os.getpid()}"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(probe)
        except OSError as exc:
            os.close(fd)
            os.close(directory_fd)
            raise DataDirError(f"data dir {directory} is not writable ({exc.strerror or exc})") from None
        self._lock = (directory_fd, fd)

    def _release_directory(self) -> None:
        if self._lock is not None:
            for fd in self._lock:
                os.close(fd)
            self._lock = None

    # -- recovery -----------------------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("journal-*.log"))

    def recover(self) -> DurableState:
        """Lock the directory, read every segment, deal with a torn tail or corruption, and open for appending.

        Raises ``DataDirError`` when the directory cannot be used, ``JournalCorrupt`` on corruption (unless
        recovering with skip-corrupt): then nothing in the directory was changed.
        """
        self._take_directory()
        try:
            hold_point("recovery")  # tests only: MINIBROKER_HOLD_AT (store/crash.py)
            return self._recover()
        except BaseException:
            self._release_directory()
            raise

    def _recover(self) -> DurableState:
        segments: list[_Segment] = []
        for path in self.segments():
            segments.append(_scan(path, legacy=all(s.salt is None for s in segments)))
        # a snapshot without its end never became the journal while older segments are still there (they are
        # removed only once it is complete); without them it is the journal, whatever happened to its end
        stale_snapshots = [s for i, s in enumerate(segments) if i > 0 and s.incomplete_snapshot]
        segments = [s for s in segments if all(s is not t for t in stale_snapshots)]
        start = max((i for i, s in enumerate(segments) if s.complete_snapshot), default=0)
        superseded, live = segments[:start], segments[start:]

        # what is wrong, decided before anything is changed
        problems: list[tuple[_Segment, _Bad]] = []
        for i, segment in enumerate(live):
            for bad in segment.bad:
                if bad.resume is None and i == len(live) - 1 and bad.offset > 0 and not segment.header_damaged:
                    continue  # a torn tail: what a crash while writing leaves (never a whole segment)
                if bad.resume is None and i < len(live) - 1:
                    bad.reason += ", with valid segments after it"
                problems.append((segment, bad))
        decoded: list[tuple[_Segment, Record, list[Op]]] = []
        for segment in live:
            for record in segment.records:
                if record.kind in (Kind.SNAPSHOT, Kind.SNAPSHOT_END, Kind.PAD):
                    decoded.append((segment, record, []))
                    continue
                try:
                    decoded.append((segment, record, decode_ops(record.kind, record.body)))
                except CorruptRecord as exc:
                    problems.append((segment, _Bad(record.offset, record.end, f"a record that does not parse ({exc})")))
        state = DurableState()
        dangling: list[tuple[_Segment, Record, str]] = []
        for segment, record, ops in decoded:
            if record.kind is Kind.SNAPSHOT:
                state = DurableState(max_message_id=state.max_message_id)
                continue
            for _, reason in state.apply_all(ops, lenient=True):
                dangling.append((segment, record, reason))
        if (problems or dangling) and not self.skip_corrupt:
            found = sorted(
                [(s.number, b.offset, s, b.reason) for s, b in problems]
                + [(s.number, r.offset, s, reason) for s, r, reason in dangling],
                key=lambda p: (p[0], p[1]),
            )
            _, offset, segment, reason = found[0]
            raise JournalCorrupt(segment.path, offset, reason, len(found))
        for segment, record, reason in dangling:
            log.error("journal %s: at byte %d, %s: skipped", segment.path.name, record.offset, reason)

        # act: keep copies, then cut torn tails and rewrite corrupt segments
        try:
            for stale in [*self.directory.glob("journal-*.tmp"), *self.directory.glob("journal-*.rewrite")]:
                stale.unlink()
            for segment in stale_snapshots:
                kept = self._quarantine(f"{segment.path.name}.incomplete-snapshot", segment.data)
                log.warning("journal %s: moved an incomplete snapshot to %s", segment.path.name, kept)
                segment.path.unlink()
            corrupt = {id(s) for s, _ in problems}
            for segment in live:
                if id(segment) in corrupt:
                    self._skip_corrupt(segment, [b for s, b in problems if s is segment])
                elif segment.torn is not None:
                    self._cut_torn_tail(segment, segment.torn)
            for segment in superseded:
                segment.path.unlink()
            self.state = state
            if live and live[-1].salt is not None:
                self._open(live[-1].path, live[-1].salt)
            else:
                # a new data dir, or one of the first format (whose segments are read, never appended to)
                number = max((s.number for s in segments), default=0) + 1
                self._start_segment(number, os.urandom(8), [], fsync=self.sync_enabled)
            if dangling:
                self._rewrite_without_dangling([s for s in live if id(s) not in corrupt and s.path.exists()])
            if self.sync_enabled:
                self._fsync_directory()
        except OSError as exc:
            raise DataDirError(f"cannot write to data dir {self.directory} ({exc.strerror or exc})") from None
        return state

    def _quarantine(self, name: str, data: bytes) -> Path:
        """Keep ``data`` in ``quarantine/`` before the journal's copy of it is cut or skipped."""
        directory = self.directory / QUARANTINE
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = directory / f"{name}-{stamp}-{os.getpid()}"
        try:
            directory.mkdir(exist_ok=True)
            with path.open("wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise DataDirError(
                f"cannot keep a copy of damaged journal data in {directory} before cutting it ({exc.strerror or exc}); "
                "nothing was changed"
            ) from None
        self.quarantined.append(path)
        return path

    def _cut_torn_tail(self, segment: _Segment, torn: _Bad) -> None:
        size = len(segment.data)
        kept = self._quarantine(f"{segment.path.name}.torn-at-{torn.offset}", segment.data[torn.offset :])
        self.dropped_bytes += size - torn.offset
        log.warning(
            "journal %s: cut a torn tail of %d bytes at byte %d (%s: an incomplete last record, never acknowledged); "
            "its bytes are kept in %s",
            segment.path.name,
            size - torn.offset,
            torn.offset,
            torn.reason,
            kept,
        )
        with segment.path.open("r+b") as handle:
            handle.truncate(torn.offset)
            handle.flush()
            os.fsync(handle.fileno())
        segment.data = segment.data[: torn.offset]
        segment.bad.remove(torn)

    def _skip_corrupt(self, segment: _Segment, bad: list[_Bad]) -> None:
        """--recover=skip-corrupt: copy the segment to quarantine, then rewrite it without the bad bytes."""
        kept = self._quarantine(f"{segment.path.name}.corrupt", segment.data)
        skip = sorted(
            {(b.offset, b.resume if b.resume is not None else len(segment.data)) for b in [*segment.bad, *bad]}
        )
        for offset, end in skip:
            self.dropped_bytes += end - offset
            reason = next((b.reason for b in [*segment.bad, *bad] if b.offset == offset), "")
            log.error(
                "journal %s: skipped %d corrupt bytes at byte %d (%s); the original segment is kept in %s",
                segment.path.name,
                end - offset,
                offset,
                reason,
                kept,
            )
        ranges = [(r.offset, r.end) for r in segment.records if not any(o <= r.offset < e for o, e in skip)]
        head = segment.data[: segment.start] if segment.salt is not None else b""
        if segment.salt is not None and any(o == 0 for o, _ in skip):
            head = segment_header(segment.salt)  # the header was damaged: write it anew
        body = b"".join(segment.data[o:e] for o, e in ranges)
        tmp = segment.path.with_name(segment.path.name + ".rewrite")
        with tmp.open("wb") as handle:
            handle.write(head + body)
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(tmp, segment.path)
        segment.data = head + body
        segment.bad.clear()

    def _rewrite_without_dangling(self, uncopied: list[_Segment]) -> None:
        """After skip-corrupt left records referring to what it skipped (they were skipped too): write the
        recovered state as a snapshot and remove the older segments, so that the next start finds nothing to
        skip (the segments are copied to quarantine first)."""
        for segment in uncopied:
            self._quarantine(f"{segment.path.name}.before-rewrite", segment.data)
        old = self.segments()
        salt = os.urandom(8)
        self._start_segment(
            self._segment + 1, salt, self._snapshot(salt, self.state.live_ops()), fsync=self.sync_enabled
        )
        for path in old:
            path.unlink()
        log.error(
            "journal: records referring to skipped data were skipped too; the journal was rewritten as %s",
            _SEGMENT.format(self._segment),
        )

    def _open(self, path: Path, salt: bytes) -> None:
        self._file = self.ops.open(path, os.O_WRONLY | os.O_APPEND)
        self._written = self._synced_offset = os.fstat(self._file).st_size
        self._tail = (self.appended, self._written)
        self._segment = int(path.name.split("-")[1].split(".")[0])
        self._salt = salt

    def _start_segment(self, number: int, salt: bytes, chunks: Iterable[bytes], *, fsync: bool = True) -> None:
        """Write a new segment (header, then ``chunks``) under a temporary name, fsync it, rename it into place,
        and append to it from now on. On OSError nothing changed (the temporary file is removed)."""
        final = self.directory / _SEGMENT.format(number)
        tmp = final.with_name(final.name + ".tmp")
        fd = self.ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        size = 0
        try:
            for chunk in _prepend(segment_header(salt), chunks):
                self._write_all(fd, chunk)
                size += len(chunk)
            if fsync:
                self._fsync(fd)
            self.ops.rename(tmp, final)
        except BaseException:
            self.ops.close(fd)
            with contextlib.suppress(OSError):
                self.ops.unlink(tmp)
            raise
        previous = self._file
        self._file = fd
        self._segment = number
        self._salt = salt
        self._written = self._synced_offset = size
        self._tail = (self.appended, size)
        self._unsynced.clear()
        self._shared = None
        if previous is not None:
            with contextlib.suppress(OSError):
                self.ops.close(previous)

    # -- appending ----------------------------------------------------------------------------------------
    @property
    def writable(self) -> bool:
        """True while appends are taken (opened, and no failed write or fsync waits for ``repair``)."""
        return self._file is not None and self.error is None

    def append(self, ops: list[Op]) -> int:
        """Write ``ops`` as one record (all or nothing); return its position for ``wait``-ing on a sync.

        Raises ``JournalUnavailable`` when the journal is failed or the write fails, ``RecordTooLarge`` when
        the record is larger than recovery reads back: then nothing of the record is on disk or in ``state``.
        """
        assert self._file is not None, "recover() first"
        if self.error is not None:
            raise JournalUnavailable(f"the journal cannot write: {self.error}")
        shared = self._shared
        ops = self._share(ops)
        record = encode_ops(ops, self._salt)
        limit = records.MAX_RECORD  # (read at each append: a test lowers it)
        if len(record) - SYNC - RECORD_HEAD.size > limit:
            self._shared = shared
            raise RecordTooLarge(f"a record of {len(record)} bytes is larger than the journal takes ({limit})")
        start = self._written
        try:
            self._write_all(self._file, record)
        except OSError as exc:
            self._fail(exc)
            with contextlib.suppress(OSError):
                self.ops.ftruncate(self._file, start)  # no half record stays (``repair`` tries again if this fails)
            raise JournalUnavailable(f"the journal cannot write: {exc}") from exc
        self._written += len(record)
        self.state.apply_all(ops)
        if self._compaction is not None:
            self._compaction.tail.append(ops)  # for the new segment too
        self.appended += 1
        self._tail = (self.appended, self._written)  # one assignment: ``sync`` (another thread) reads both
        if self.sync_enabled:
            while self._unsynced and self._unsynced[0][0] <= self.synced:
                self._unsynced.popleft()
            self._unsynced.append((self.appended, record))
        else:
            self.synced = self.appended
        return self.appended

    def _share(self, ops: list[Op]) -> list[Op]:
        """ENQUEUEs of the payload written last (the same bytes object: one publish to several nodes) become
        references to it, while the journal still holds it."""
        shared = self._shared
        written: set[int] = set()
        out = []
        for op in ops:
            if op.kind is Kind.ENQUEUE and op.payload:
                if (
                    shared is not None
                    and op.payload is shared[0]
                    and (shared[1] in written or shared[1] in self.state.payloads)
                ):
                    op = replace(op, kind=Kind.ENQUEUE_REF, payload=b"", payload_id=shared[1])
                else:
                    shared = (op.payload, op.payload_id or op.message_id)
                    written.add(shared[1])
            out.append(op)
        self._shared = shared
        return out

    def _write_all(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` (a short write is continued), or raise OSError."""
        view = memoryview(data)
        done = 0
        while done < len(data):
            n = self.ops.write(fd, view[done:])
            if n <= 0:
                raise OSError(errno.ENOSPC, "the write made no progress")
            self.io.wrote(n)
            done += n

    def _fsync(self, fd: int) -> None:
        """fsync ``fd`` (raises OSError), counted."""
        self.ops.fsync(fd)
        self.io.synced()

    def _fail(self, exc: OSError, *, resync: bool = False) -> None:
        if self.error is None:
            self.error = exc
        self._resync = self._resync or resync

    def sync(self) -> int:
        """fsync everything appended so far; return the position now durable.

        Raises ``JournalUnavailable`` when the journal is failed or the fsync fails.
        """
        target, offset = self._tail
        if self._file is not None and self.sync_enabled and target > self.synced:
            if self.error is not None:
                raise JournalUnavailable(f"the journal cannot write: {self.error}")
            try:
                self._fsync(self._file)
            except OSError as exc:
                # what the fsync covered may be lost (the kernel may drop the pages it failed to write)
                self._fail(exc, resync=True)
                raise JournalUnavailable(f"the journal cannot fsync: {exc}") from exc
        if target > self.synced:
            self.synced = target
            self._synced_offset = offset
        return self.synced

    def repair(self) -> None:
        """After a failed write or fsync: cut the segment back to its last complete record, rewrite what a failed
        fsync may have lost, and check that there is room again (a probe record written and fsynced, then cut).
        Raises ``JournalUnavailable`` while that fails; once it succeeds, everything appended is durable and
        appends are taken again."""
        if self.error is None or self._file is None:
            return
        fd = self._file
        try:
            if self._directory_unsynced:
                self._fsync_directory()
                self._directory_unsynced = False
            if self._resync:
                self.ops.ftruncate(fd, self._synced_offset)
                for position, record in self._unsynced:
                    if position > self.synced:
                        self._write_all(fd, record)
            else:
                self.ops.ftruncate(fd, self._written)
            self._write_all(fd, encode_record(Kind.PAD, bytes(_PROBE), self._salt))
            self._fsync(fd)
            self.ops.ftruncate(fd, self._written)
        except OSError as exc:
            self.error = exc
            raise JournalUnavailable(f"the journal still cannot write: {exc}") from exc
        self._resync = False
        self.error = None
        self.synced = self.appended
        self._synced_offset = self._written
        self._unsynced.clear()

    # -- compaction ---------------------------------------------------------------------------------------
    def needs_compaction(self) -> bool:
        """True when the journal outgrew its live content (O(1): the live size is kept up to date)."""
        return (
            self._written > self.compact_at
            and self._written > self._compact_floor
            and self._written > 4 * self.state.live_bytes
        )

    def compact(self) -> bool:
        """Rewrite the live state into a new segment, then delete the older ones (crash-safe): all three steps
        of a compaction at once (the I/O layer runs ``write_snapshot`` in a worker thread instead).

        Returns False, keeping the old segments, when the journal is failed or the new segment cannot be
        written (disk full): then compaction is not tried again before the journal grew by another quarter.
        Raises ``JournalUnavailable`` (the journal failed, the old segments kept) when the directory cannot be
        fsynced once the new segment is in place: ``repair()`` fsyncs it.
        """
        compaction = self.begin_compaction()
        if compaction is None:
            return False
        self.write_snapshot(compaction)
        return self.finish_compaction(compaction)

    def begin_compaction(self) -> Compaction | None:
        """Capture the live state for a snapshot (None: the journal is failed, or a compaction is under way).
        Records appended from now on are kept for the new segment too, until ``finish_compaction``."""
        if self._file is None or self.error is not None or self._compaction is not None:
            return None
        number = self._segment + 1
        final = self.directory / _SEGMENT.format(number)
        compaction = Compaction(
            number, os.urandom(8), self.segments(), self.state.capture(), final.with_name(final.name + ".tmp")
        )
        self._compaction = compaction
        return compaction

    def write_snapshot(self, compaction: Compaction) -> None:
        """Write and fsync the snapshot under a temporary name. Touches nothing of the journal but ``compaction``
        (safe in a worker thread while records are appended); a failure is kept for ``finish_compaction``."""
        try:
            compaction.fd = self.ops.open(compaction.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            salt = compaction.salt
            for chunk in _prepend(segment_header(salt), self._snapshot(salt, snapshot_ops(compaction.capture))):
                self._write_all(compaction.fd, chunk)
                compaction.size += len(chunk)
            if self.sync_enabled:
                self._fsync(compaction.fd)
        except OSError as exc:
            compaction.error = exc

    def finish_compaction(self, compaction: Compaction) -> bool:
        """Append the records written since the capture to the snapshot, fsync it, rename it into place, append to
        it from now on, and delete the older segments. Returns and raises as ``compact``."""
        self._compaction = None
        fd = compaction.fd
        try:
            if compaction.error is not None:
                raise compaction.error
            if self.error is not None or fd is None:
                raise OSError(errno.EIO, f"the journal failed meanwhile ({self.error})")
            tail = b"".join(encode_ops(ops, compaction.salt) for ops in compaction.tail)
            self._write_all(fd, tail)
            if self.sync_enabled:
                self._fsync(fd)
            self.ops.rename(compaction.tmp, self.directory / _SEGMENT.format(compaction.number))
        except OSError as exc:
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.ops.close(fd)
            with contextlib.suppress(OSError):
                self.ops.unlink(compaction.tmp)
            self._compact_floor = self._written + self._written // 4
            log.warning("journal: compaction abandoned (%s); the old segments are kept", exc.strerror or exc)
            return False
        previous = self._file
        self._file = fd
        self._segment = compaction.number
        self._salt = compaction.salt
        self._written = self._synced_offset = compaction.size + len(tail)
        self._tail = (self.appended, self._written)
        self.synced = self.appended  # everything is in the new segment, fsynced
        self._unsynced.clear()
        self._shared = None
        if previous is not None:
            with contextlib.suppress(OSError):
                self.ops.close(previous)
        # not again before the journal is well past its snapshot (whatever the live size says)
        self._compact_floor = _COMPACT_GROWTH * self._written
        try:
            self._fsync_directory()
        except OSError as exc:
            # the new segment may not be durable yet: take nothing until it is (``repair``), keep the old ones
            self._directory_unsynced = True
            self._fail(exc)
            raise JournalUnavailable(f"the journal cannot fsync its directory after a compaction: {exc}") from exc
        for path in compaction.old:
            try:
                self.ops.unlink(path)
            except OSError as exc:
                log.warning("journal: cannot remove %s after compaction (%s)", path.name, exc.strerror or exc)
        with contextlib.suppress(OSError):
            self._fsync_directory()
        return True

    def abandon_compaction(self, compaction: Compaction) -> None:
        """Give up a compaction under way (the broker stops, or ``write_snapshot`` failed unexpectedly): its
        file is removed, the old segments stay."""
        if self._compaction is compaction:
            self._compaction = None
        if compaction.fd is not None:
            with contextlib.suppress(OSError):
                self.ops.close(compaction.fd)
            compaction.fd = None
        with contextlib.suppress(OSError):
            self.ops.unlink(compaction.tmp)

    @staticmethod
    def _snapshot(salt: bytes, ops: Iterable[Op]) -> Iterator[bytes]:
        """The records of a snapshot of ``ops`` (the live state), in chunks of about 1 MiB."""
        chunk = [encode_record(Kind.SNAPSHOT, b"", salt)]
        size = 0
        for op in ops:
            record = encode_ops([op], salt)
            chunk.append(record)
            size += len(record)
            if size >= 1 << 20:
                yield b"".join(chunk)
                chunk, size = [], 0
        chunk.append(encode_record(Kind.SNAPSHOT_END, b"", salt))
        yield b"".join(chunk)

    def _fsync_directory(self) -> None:
        fd = self.ops.open(self.directory, os.O_RDONLY)
        try:
            self._fsync(fd)
        finally:
            self.ops.close(fd)

    def close(self) -> None:
        """fsync (when it can) and close; release the data dir."""
        if self._compaction is not None:
            self.abandon_compaction(self._compaction)
        if self._file is not None:
            try:
                self.sync()
            except JournalUnavailable as exc:
                log.error("journal: closing without a final fsync (%s)", exc)
            with contextlib.suppress(OSError):
                self.ops.close(self._file)
            self._file = None
        self._release_directory()

    def __del__(self) -> None:
        # a journal dropped without close() (tests) must not keep its data dir locked
        try:
            if self._file is not None:
                os.close(self._file)
                self._file = None
            self._release_directory()
        except Exception:  # nothing may escape a finalizer
            pass


def _prepend(first: bytes, rest: Iterable[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
