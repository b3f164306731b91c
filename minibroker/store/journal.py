"""An append-only journal of durable broker state, with torn-tail recovery and crash-safe compaction.

Theory of operation
-------------------
The journal is a sequence of segment files ``journal-NNNNNNNN.log`` in the data directory. A segment is a
sequence of records::

    length (u32, bytes after this field) | crc32 (u32, of what follows) | kind (u8) | body

Appending writes to the current segment at once (the operating system's cache); ``sync()`` fsyncs it.
Callers that promise durability (an ``accepted`` sent to a client) wait for a sync that covers their
record; records waiting together share one fsync (group commit).

Recovery reads the segments in order and stops at the first record whose length runs past the file or
whose checksum does not match: that is a torn or corrupt tail, cut off (the file is truncated there, and
the number of bytes dropped is logged). Records are replayed into a ``DurableState``.

Compaction writes the live state into a fresh segment that starts with a SNAPSHOT record and ends with a
SNAPSHOT_END record, fsyncs it, then deletes the older segments. Recovery starts from the newest segment
whose snapshot is complete, so a crash at any moment of compaction loses nothing and replays nothing twice:
before SNAPSHOT_END is durable the old segments still rule; after it, the snapshot does.

This module does file I/O and nothing else: no trio, no clock.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

log = logging.getLogger("minibroker.store")

_RECORD_HEAD = struct.Struct(">II")  # length, crc32
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_SEGMENT = "journal-{:08d}.log"
MAX_RECORD = 1 << 30


class Kind(IntEnum):
    """Record kinds."""

    ENQUEUE = 1  # node key, message id, delivery-count, message bytes
    SETTLE = 2  # node key, message id: the message is gone (accepted, rejected, expired, moved)
    COUNT = 3  # node key, message id, delivery-count: a failed delivery was counted
    TXN = 4  # several ENQUEUE/SETTLE records applied together: one committed transaction
    SUBSCRIBE = 5  # node key of a durable subscription, and its selector text
    UNSUBSCRIBE = 6  # node key of a durable subscription that was deleted
    SNAPSHOT = 7  # the start of a compacted segment: everything before it is void once it is complete
    SNAPSHOT_END = 8  # the end of a compacted segment's snapshot


class CorruptRecord(Exception):
    """A record body that does not parse (a bug, or a disk error past the checksum)."""


def _pack_str(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U32.pack(len(raw)) + raw


def _unpack_str(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    if pos + n > len(data):
        raise CorruptRecord("string runs past the record")
    return data[pos : pos + n].decode("utf-8"), pos + n


# A durable node is named by (namespace, kind, name), kind "queue" or "subscription"; a subscription's name
# is "topic\x00container\x00link".
NodeKey = tuple[str, str, str]


def _pack_key(key: NodeKey) -> bytes:
    return b"".join(_pack_str(part) for part in key)


def _unpack_key(data: bytes, pos: int) -> tuple[NodeKey, int]:
    namespace, pos = _unpack_str(data, pos)
    kind, pos = _unpack_str(data, pos)
    name, pos = _unpack_str(data, pos)
    return (namespace, kind, name), pos


@dataclass(frozen=True)
class Op:
    """One change of durable state."""

    kind: Kind
    key: NodeKey
    message_id: int = 0
    delivery_count: int = 0
    payload: bytes = b""
    selector: str = ""

    def encode(self) -> bytes:
        head = bytes([self.kind]) + _pack_key(self.key)
        if self.kind is Kind.ENQUEUE:
            return head + _U64.pack(self.message_id) + _U32.pack(self.delivery_count) + self.payload
        if self.kind in (Kind.SETTLE,):
            return head + _U64.pack(self.message_id)
        if self.kind is Kind.COUNT:
            return head + _U64.pack(self.message_id) + _U32.pack(self.delivery_count)
        if self.kind is Kind.SUBSCRIBE:
            return head + _pack_str(self.selector)
        return head  # UNSUBSCRIBE

    @classmethod
    def decode(cls, data: bytes) -> Op:
        try:
            kind = Kind(data[0])
            key, pos = _unpack_key(data, 1)
            if kind is Kind.ENQUEUE:
                (message_id,) = _U64.unpack_from(data, pos)
                (count,) = _U32.unpack_from(data, pos + 8)
                return cls(kind, key, message_id, count, bytes(data[pos + 12 :]))
            if kind is Kind.SETTLE:
                return cls(kind, key, _U64.unpack_from(data, pos)[0])
            if kind is Kind.COUNT:
                (message_id,) = _U64.unpack_from(data, pos)
                return cls(kind, key, message_id, _U32.unpack_from(data, pos + 8)[0])
            if kind is Kind.SUBSCRIBE:
                selector, _ = _unpack_str(data, pos)
                return cls(kind, key, selector=selector)
            if kind is Kind.UNSUBSCRIBE:
                return cls(kind, key)
        except (IndexError, ValueError, struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(str(exc)) from None
        raise CorruptRecord(f"record kind {kind} cannot appear inside an operation")


def encode_record(kind: Kind, body: bytes) -> bytes:
    """One framed, checksummed record."""
    content = bytes([kind]) + body
    return _RECORD_HEAD.pack(len(content) + 4, zlib.crc32(content)) + content


def encode_ops(ops: list[Op]) -> bytes:
    """The record for ``ops``: a single operation as itself, several as one TXN record (all or nothing)."""
    if len(ops) == 1:
        op = ops[0].encode()
        return encode_record(Kind(op[0]), op[1:])
    body = b"".join(_U32.pack(len(e)) + e for e in (op.encode() for op in ops))
    return encode_record(Kind.TXN, body)


def decode_ops(kind: Kind, body: bytes) -> list[Op]:
    """The operations in one record's body."""
    if kind is Kind.TXN:
        ops = []
        pos = 0
        while pos < len(body):
            (n,) = _U32.unpack_from(body, pos)
            ops.append(Op.decode(body[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        return ops
    return [Op.decode(bytes([kind]) + body)]


@dataclass
class StoredMessage:
    message_id: int
    delivery_count: int
    payload: bytes


@dataclass
class DurableState:
    """What the journal says exists: durable nodes, their messages in order, durable subscriptions."""

    messages: dict[NodeKey, dict[int, StoredMessage]] = field(default_factory=dict)
    subscriptions: dict[NodeKey, str] = field(default_factory=dict)
    max_message_id: int = 0

    def apply(self, op: Op) -> None:
        if op.kind is Kind.ENQUEUE:
            self.messages.setdefault(op.key, {})[op.message_id] = StoredMessage(
                op.message_id, op.delivery_count, op.payload
            )
            self.max_message_id = max(self.max_message_id, op.message_id)
        elif op.kind is Kind.SETTLE:
            node = self.messages.get(op.key)
            if node is not None:
                node.pop(op.message_id, None)
        elif op.kind is Kind.COUNT:
            stored = self.messages.get(op.key, {}).get(op.message_id)
            if stored is not None:
                stored.delivery_count = op.delivery_count
        elif op.kind is Kind.SUBSCRIBE:
            self.subscriptions[op.key] = op.selector
            self.messages.setdefault(op.key, {})
        elif op.kind is Kind.UNSUBSCRIBE:
            self.subscriptions.pop(op.key, None)
            self.messages.pop(op.key, None)

    def live_ops(self) -> Iterator[Op]:
        """Operations that recreate this state (for compaction)."""
        for key, selector in self.subscriptions.items():
            yield Op(Kind.SUBSCRIBE, key, selector=selector)
        for key, messages in self.messages.items():
            for stored in messages.values():
                yield Op(Kind.ENQUEUE, key, stored.message_id, stored.delivery_count, stored.payload)

    @property
    def message_count(self) -> int:
        return sum(len(m) for m in self.messages.values())


def _read_records(path: Path) -> tuple[list[tuple[Kind, bytes]], int, int]:
    """The records of a segment, the offset where valid data ends, and the file size."""
    data = path.read_bytes()
    records = []
    pos = 0
    while pos + _RECORD_HEAD.size <= len(data):
        length, crc = _RECORD_HEAD.unpack_from(data, pos)
        end = pos + 4 + length
        if length < 5 or length > MAX_RECORD or end > len(data):
            break
        content = data[pos + _RECORD_HEAD.size : end]
        if zlib.crc32(content) != crc:
            break
        try:
            kind = Kind(content[0])
        except ValueError:
            break
        records.append((kind, bytes(content[1:])))
        pos = end
    return records, pos, len(data)


class Journal:
    """The journal in ``directory``: recover it, append to it, sync it, compact it."""

    def __init__(self, directory: str | Path, *, sync: bool = True, compact_at: int = 64 << 20) -> None:
        self.directory = Path(directory)
        self.sync_enabled = sync
        self.compact_at = compact_at
        self.state = DurableState()
        self._file: int | None = None
        self._segment = 0
        self._written = 0  # bytes appended to the current segment
        self.appended = 0  # records appended since start (positions handed out)
        self.synced = 0  # records known to be on disk
        self.dropped_bytes = 0  # torn or corrupt tail bytes cut off at recovery

    # -- recovery ---------------------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("journal-*.log"))

    def recover(self) -> DurableState:
        """Read every segment (cutting a torn tail) and open the last one for appending."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("journal-*.tmp"):
            stale.unlink()
        segments = self.segments()
        start = 0
        parsed: list[list[tuple[Kind, bytes]]] = []
        for path in list(segments):
            records, _, _ = _read_records(path)
            if records and records[0][0] is Kind.SNAPSHOT and not any(k is Kind.SNAPSHOT_END for k, _ in records):
                # an unfinished snapshot never became the journal (it is only renamed once complete)
                log.warning("journal %s: removed an incomplete snapshot", path.name)
                path.unlink()
                segments.remove(path)
        for i, path in enumerate(segments):
            records, valid, size = _read_records(path)
            if valid < size:
                self.dropped_bytes += size - valid
                log.warning("journal %s: cut a torn or corrupt tail of %d bytes", path.name, size - valid)
                with path.open("r+b") as handle:
                    handle.truncate(valid)
                    handle.flush()
                    os.fsync(handle.fileno())
            parsed.append(records)
            if records and records[0][0] is Kind.SNAPSHOT and any(k is Kind.SNAPSHOT_END for k, _ in records):
                start = i  # a complete snapshot: everything before it is void
        state = DurableState()
        for records in parsed[start:]:
            for kind, body in records:
                if kind in (Kind.SNAPSHOT, Kind.SNAPSHOT_END):
                    if kind is Kind.SNAPSHOT:
                        state = DurableState(max_message_id=state.max_message_id)
                    continue
                for op in decode_ops(kind, body):
                    state.apply(op)
        for path in segments[:start]:
            path.unlink()
        self.state = state
        self._segment = int(segments[-1].stem.split("-")[1]) if segments else 1
        self._open(self._segment)
        return state

    def _open(self, number: int) -> None:
        path = self.directory / _SEGMENT.format(number)
        self._file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._written = os.fstat(self._file).st_size
        self._segment = number

    # -- appending --------------------------------------------------------------------------------------
    def append(self, ops: list[Op]) -> int:
        """Write ``ops`` as one record (all or nothing); return its position for ``wait``-ing on a sync."""
        assert self._file is not None, "recover() first"
        record = encode_ops(ops)
        os.write(self._file, record)
        self._written += len(record)
        for op in ops:
            self.state.apply(op)
        self.appended += 1
        if not self.sync_enabled:
            self.synced = self.appended
        return self.appended

    def sync(self) -> int:
        """fsync everything appended so far; return the position now durable."""
        target = self.appended
        if self._file is not None and self.sync_enabled and target > self.synced:
            os.fsync(self._file)
        self.synced = max(self.synced, target)
        return self.synced

    def needs_compaction(self) -> bool:
        return self._written > self.compact_at and self._written > 4 * self._live_bytes()

    def _live_bytes(self) -> int:
        return sum(len(m.payload) + 64 for node in self.state.messages.values() for m in node.values()) + 1024

    def compact(self) -> None:
        """Rewrite the live state into a new segment, then delete the older ones (crash-safe)."""
        assert self._file is not None
        self.sync()
        number = self._segment + 1
        tmp = self.directory / (_SEGMENT.format(number) + ".tmp")
        with tmp.open("wb") as handle:
            handle.write(encode_record(Kind.SNAPSHOT, b""))
            for op in self.state.live_ops():
                handle.write(encode_ops([op]))
            handle.write(encode_record(Kind.SNAPSHOT_END, b""))
            handle.flush()
            os.fsync(handle.fileno())
        final = self.directory / _SEGMENT.format(number)
        tmp.rename(final)
        self._fsync_directory()
        old = [p for p in self.segments() if p != final]
        os.close(self._file)
        self._open(number)
        for path in old:
            path.unlink()
        self._fsync_directory()

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            os.close(self._file)
            self._file = None
