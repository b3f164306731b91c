"""An append-only journal of durable broker state: torn tails told from corruption, shared payloads, a lock on
its directory, write failures survived, and crash-safe compaction.

Theory of operation
-------------------
The journal is a sequence of segment files ``journal-NNNNNNNN.log`` in the data directory, which a broker
holds with an exclusive lock (on the directory itself and on ``minibroker.lock``, which holds the holder's pid)
for as long as it runs. A segment starts with a header: a magic, the format version and 8 random bytes (the
segment's *salt*), checksummed. Then records::

    sync (the salt's first 4 bytes) | length (u32, bytes after this field) | crc32 (u32) | kind (u8) | body

The checksum covers kind and body and is seeded with the salt, so a record is only valid in its own segment:
bytes a client put in a message body can never pass for a record, even when a recovery looks for valid data
past a damaged one. (Segments written before the header existed have neither header nor sync marker and an
unseeded checksum; they are still read, and record kinds 1-6 keep their first layout.)

Operations (``Op``) name a node by a tuple of strings, each length-prefixed UTF-8: ``(namespace, "queue",
name)`` or ``(namespace, "subscription", topic, container-id, link name)``, so any name round-trips, NUL
included. An ENQUEUE keeps the message's expiry and delivery time as absolute wall-clock milliseconds (the
broker's clock restarts with the process). The payload of a message published to several durable nodes (a
topic's subscriptions) is written once: the first ENQUEUE carries it and gives it an id, the others are
ENQUEUE_REF records naming that id; the state keeps one copy while any message holds it.

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

This module does file I/O and nothing else: no trio, no clock. Nothing here needs more than O(1) work per
operation to decide on compaction: the live size is kept up to date as records are applied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import struct
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path

log = logging.getLogger("minibroker.store")

_RECORD_HEAD = struct.Struct(">II")  # length, crc32
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_SEGMENT = "journal-{:08d}.log"
LOCK_FILE = "minibroker.lock"
QUARANTINE = "quarantine"
MAX_RECORD = 1 << 30
MAGIC = b"MBJL"
VERSION = 2
_HEADER = struct.Struct(">4sI8sI")  # magic, version, salt, crc32 of the 16 bytes before it
_SYNC = 4  # bytes of the sync marker in front of a record of a salted segment
_PROBE = 4096  # bytes of the probe record ``repair`` writes to check there is room again
_MESSAGE_OVERHEAD = 64  # what a message costs in a snapshot besides its payload (for the compaction check)
_BASE_LIVE = 1024
_COMPACT_GROWTH = 3  # after a compaction, not again before the segment is this many times its snapshot
_U32_MAX = 0xFFFFFFFF
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class Kind(IntEnum):
    """Record kinds, as written in the record's kind byte."""

    # the first format: read, never written (keys of three strings, a subscription's name "topic\0container\0link")
    LEGACY_ENQUEUE = 1
    LEGACY_SETTLE = 2
    LEGACY_COUNT = 3
    LEGACY_SUBSCRIBE = 5
    LEGACY_UNSUBSCRIBE = 6
    TXN = 4  # several operations applied together: one committed transaction, or one publish to several nodes
    SNAPSHOT = 7  # the start of a compacted segment: everything before it is void once it is complete
    SNAPSHOT_END = 8  # the end of a compacted segment's snapshot
    ENQUEUE = 17  # key, message id, delivery-count, times, payload id, message bytes
    SETTLE = 18  # key, message id: the message is gone (accepted, rejected, expired, moved)
    COUNT = 19  # key, message id, delivery-count: a failed delivery was counted
    SUBSCRIBE = 21  # key of a durable subscription, and its selector text
    UNSUBSCRIBE = 22  # key of a durable subscription that was deleted
    ENQUEUE_REF = 23  # like ENQUEUE, its bytes those of the payload id (written once, by an earlier ENQUEUE)
    PAD = 24  # nothing (the probe record of ``repair``)


_LEGACY = {
    Kind.LEGACY_ENQUEUE: Kind.ENQUEUE,
    Kind.LEGACY_SETTLE: Kind.SETTLE,
    Kind.LEGACY_COUNT: Kind.COUNT,
    Kind.LEGACY_SUBSCRIBE: Kind.SUBSCRIBE,
    Kind.LEGACY_UNSUBSCRIBE: Kind.UNSUBSCRIBE,
}
_OPERATIONS = frozenset((Kind.ENQUEUE, Kind.SETTLE, Kind.COUNT, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE, Kind.ENQUEUE_REF))
_KIND_BYTES = frozenset(int(k) for k in Kind)
_HAS_EXPIRY, _HAS_DELIVERY, _UNTIMED = 1, 2, 4
_SHARED = 1  # SUBSCRIBE flags


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
    """A record larger than recovery reads back (``MAX_RECORD``): not written, nothing applied."""


class CorruptRecord(Exception):
    """A record body that does not parse (a bug, or a disk error past the checksum)."""


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


# -- encoding --------------------------------------------------------------------------------------------
def _pack_str(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return _U32.pack(len(raw)) + raw


def _unpack_str(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    if pos + n > len(data):
        raise CorruptRecord("string runs past the record")
    return data[pos : pos + n].decode("utf-8", "surrogatepass"), pos + n


# A durable node is named by a tuple of strings: (namespace, "queue", name) or
# (namespace, "subscription", topic, container-id, link name).
NodeKey = tuple[str, ...]


def _pack_key(key: NodeKey) -> bytes:
    if len(key) > 255:
        raise ValueError("a node key has at most 255 parts")
    return bytes([len(key)]) + b"".join(_pack_str(part) for part in key)


def _unpack_key(data: bytes, pos: int) -> tuple[NodeKey, int]:
    parts = []
    count = data[pos]
    pos += 1
    for _ in range(count):
        part, pos = _unpack_str(data, pos)
        parts.append(part)
    return tuple(parts), pos


def _unpack_legacy_key(data: bytes, pos: int) -> tuple[NodeKey, int]:
    namespace, pos = _unpack_str(data, pos)
    kind, pos = _unpack_str(data, pos)
    name, pos = _unpack_str(data, pos)
    if kind != "subscription":
        return (namespace, kind, name), pos
    # "topic\0container\0link": ambiguous when a name held a NUL (the reason the format changed); the topic and
    # container-id are taken up to the first NULs, the link name is the rest
    topic, _, rest = name.partition("\x00")
    container, _, link = rest.partition("\x00")
    if name.count("\x00") != 2:
        log.warning("journal: a subscription name of the first format held a NUL; read as %r", (topic, container, link))
    return (namespace, kind, topic, container, link), pos


def _clamp(value: int, low: int, high: int) -> int:
    return low if value < low else high if value > high else value


@dataclass(frozen=True)
class Op:
    """One change of durable state.

    ``expires_at`` and ``deliver_at`` are wall-clock milliseconds (None: no expiry, no delivery time);
    ``timed`` is False for messages of the first format, which did not keep them. ``payload_id`` names the
    payload an ENQUEUE gives (0: its own message id) or an ENQUEUE_REF takes.
    """

    kind: Kind
    key: NodeKey
    message_id: int = 0
    delivery_count: int = 0
    payload: bytes = b""
    selector: str = ""
    expires_at: int | None = None
    deliver_at: int | None = None
    payload_id: int = 0
    timed: bool = True
    shared: bool = False  # a SUBSCRIBE: the subscription is shared (its links compete for its messages)

    def encode(self) -> bytes:
        kind = self.kind
        head = bytes([kind]) + _pack_key(self.key)
        if kind is Kind.ENQUEUE or kind is Kind.ENQUEUE_REF:
            flags = (
                (_HAS_EXPIRY if self.expires_at is not None else 0)
                | (_HAS_DELIVERY if self.deliver_at is not None else 0)
                | (0 if self.timed else _UNTIMED)
            )
            parts = [
                head,
                _U64.pack(self.message_id),
                _U32.pack(_clamp(self.delivery_count, 0, _U32_MAX)),
                bytes([flags]),
            ]
            if self.expires_at is not None:
                parts.append(_I64.pack(_clamp(self.expires_at, _I64_MIN, _I64_MAX)))
            if self.deliver_at is not None:
                parts.append(_I64.pack(_clamp(self.deliver_at, _I64_MIN, _I64_MAX)))
            parts.append(_U64.pack(self.payload_id))
            if kind is Kind.ENQUEUE:
                parts.append(self.payload)
            return b"".join(parts)
        if kind is Kind.SETTLE:
            return head + _U64.pack(self.message_id)
        if kind is Kind.COUNT:
            return head + _U64.pack(self.message_id) + _U32.pack(_clamp(self.delivery_count, 0, _U32_MAX))
        if kind is Kind.SUBSCRIBE:
            # the flags byte came later: a reader before it ignores it, a record before it has none (not shared)
            return head + _pack_str(self.selector) + bytes([_SHARED if self.shared else 0])
        if kind is Kind.UNSUBSCRIBE:
            return head
        raise ValueError(f"{kind!r} is not an operation")

    @classmethod
    def decode(cls, data: bytes) -> Op:
        try:
            kind = Kind(data[0])
            if kind in _LEGACY:
                return cls._decode_legacy(_LEGACY[kind], data)
            key, pos = _unpack_key(data, 1)
            if kind is Kind.ENQUEUE or kind is Kind.ENQUEUE_REF:
                (message_id,) = _U64.unpack_from(data, pos)
                (count,) = _U32.unpack_from(data, pos + 8)
                flags = data[pos + 12]
                pos += 13
                expires = deliver = None
                if flags & _HAS_EXPIRY:
                    (expires,) = _I64.unpack_from(data, pos)
                    pos += 8
                if flags & _HAS_DELIVERY:
                    (deliver,) = _I64.unpack_from(data, pos)
                    pos += 8
                (payload_id,) = _U64.unpack_from(data, pos)
                pos += 8
                if kind is Kind.ENQUEUE_REF and pos != len(data):
                    raise CorruptRecord("bytes after a payload reference")
                payload = bytes(data[pos:]) if kind is Kind.ENQUEUE else b""
                timed = not flags & _UNTIMED
                return cls(kind, key, message_id, count, payload, "", expires, deliver, payload_id, timed)
            if kind in (Kind.SETTLE, Kind.COUNT):
                return cls._settle_or_count(kind, key, data, pos)
            if kind is Kind.SUBSCRIBE:
                selector, pos = _unpack_str(data, pos)
                flags = data[pos] if pos < len(data) else 0
                return cls(kind, key, selector=selector, shared=bool(flags & _SHARED))
            if kind is Kind.UNSUBSCRIBE:
                return cls(kind, key)
        except (IndexError, ValueError, struct.error, UnicodeDecodeError) as exc:
            raise CorruptRecord(str(exc)) from None
        raise CorruptRecord(f"record kind {kind.name} cannot appear inside an operation")

    @classmethod
    def _decode_legacy(cls, kind: Kind, data: bytes) -> Op:
        key, pos = _unpack_legacy_key(data, 1)
        if kind is Kind.ENQUEUE:
            (message_id,) = _U64.unpack_from(data, pos)
            (count,) = _U32.unpack_from(data, pos + 8)
            return cls(kind, key, message_id, count, bytes(data[pos + 12 :]), timed=False)
        if kind in (Kind.SETTLE, Kind.COUNT):
            return cls._settle_or_count(kind, key, data, pos)
        if kind is Kind.SUBSCRIBE:
            selector, _ = _unpack_str(data, pos)
            return cls(kind, key, selector=selector)
        return cls(kind, key)

    @classmethod
    def _settle_or_count(cls, kind: Kind, key: NodeKey, data: bytes, pos: int) -> Op:
        """The body of a SETTLE (message id) or COUNT (message id, delivery-count) record, the same in both
        formats."""
        (message_id,) = _U64.unpack_from(data, pos)
        if kind is Kind.SETTLE:
            return cls(kind, key, message_id)
        return cls(kind, key, message_id, _U32.unpack_from(data, pos + 8)[0])


def _seed(salt: bytes) -> int:
    return zlib.crc32(salt)


def encode_record(kind: Kind, body: bytes, salt: bytes | None = None) -> bytes:
    """One framed, checksummed record; with ``salt``, as in a segment with that salt (else headerless)."""
    kind_byte = bytes([kind])
    if salt is None:
        crc = zlib.crc32(body, zlib.crc32(kind_byte))
        return b"".join((_RECORD_HEAD.pack(len(body) + 5, crc), kind_byte, body))
    crc = zlib.crc32(body, zlib.crc32(kind_byte, _seed(salt)))
    return b"".join((salt[:_SYNC], _RECORD_HEAD.pack(len(body) + 5, crc), kind_byte, body))


def encode_ops(ops: list[Op], salt: bytes | None = None) -> bytes:
    """The record for ``ops``: a single operation as itself, several as one TXN record (all or nothing)."""
    if len(ops) == 1:
        op = ops[0].encode()
        return encode_record(Kind(op[0]), op[1:], salt)
    body = b"".join(_U32.pack(len(e)) + e for e in (op.encode() for op in ops))
    return encode_record(Kind.TXN, body, salt)


def decode_ops(kind: Kind, body: bytes) -> list[Op]:
    """The operations in one record's body."""
    if kind is Kind.TXN:
        ops = []
        pos = 0
        try:
            while pos < len(body):
                (n,) = _U32.unpack_from(body, pos)
                if pos + 4 + n > len(body):
                    raise CorruptRecord("an operation runs past its transaction record")
                ops.append(Op.decode(body[pos + 4 : pos + 4 + n]))
                pos += 4 + n
        except struct.error as exc:
            raise CorruptRecord(str(exc)) from None
        return ops
    return [Op.decode(bytes([kind]) + body)]


def segment_header(salt: bytes) -> bytes:
    """The header of a segment of this format with ``salt`` (8 bytes)."""
    head = struct.pack(">4sI8s", MAGIC, VERSION, salt)
    return head + _U32.pack(zlib.crc32(head))


# -- state ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class StoredMessage:
    message_id: int
    delivery_count: int
    payload: bytes
    payload_id: int = 0
    expires_at: int | None = None  # wall-clock ms
    deliver_at: int | None = None  # wall-clock ms
    timed: bool = True  # False: written by the first format, which did not keep the times


@dataclass
class DurableState:
    """What the journal says exists: durable nodes, their messages, durable subscriptions, shared payloads.

    ``live_bytes`` (what a snapshot of this state would about take: payloads, and each message's and
    subscription's node name) and ``message_count`` are kept up to date by ``apply``: deciding whether to
    compact never walks the messages.
    """

    messages: dict[NodeKey, dict[int, StoredMessage]] = field(default_factory=dict)
    subscriptions: dict[NodeKey, str] = field(default_factory=dict)
    shared: set[NodeKey] = field(default_factory=set)  # the subscriptions that are shared
    max_message_id: int = 0
    payloads: dict[int, bytes] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)
    live_bytes: int = _BASE_LIVE
    message_count: int = 0
    _key_sizes: dict[NodeKey, int] = field(default_factory=dict, repr=False)

    def apply(self, op: Op) -> None:
        freed: list[int] = []
        self._apply(op, freed)
        if freed:
            self._free(freed)

    def apply_all(self, ops: Iterable[Op], *, lenient: bool = False) -> list[tuple[Op, str]]:
        """Apply the operations of one record. A payload no message holds any more is freed at the end of the
        record (so an operation later in the record may still refer to it). ``lenient``: an operation that
        cannot apply (a reference to a payload that is not there) is skipped and returned with the reason;
        otherwise it raises ``CorruptRecord``."""
        freed: list[int] = []
        skipped: list[tuple[Op, str]] = []
        if not lenient:
            for op in ops:
                self._apply(op, freed)
        else:
            for op in ops:
                try:
                    self._apply(op, freed)
                except CorruptRecord as exc:
                    skipped.append((op, str(exc)))
        if freed:
            self._free(freed)
        return skipped

    def _free(self, freed: list[int]) -> None:
        for payload_id in freed:
            if self.refs.get(payload_id) == 0:
                del self.refs[payload_id]
                self.live_bytes -= len(self.payloads.pop(payload_id))

    def _apply(self, op: Op, freed: list[int]) -> None:
        kind = op.kind
        if kind is Kind.ENQUEUE or kind is Kind.ENQUEUE_REF:
            payload_id = op.payload_id or op.message_id
            if kind is Kind.ENQUEUE_REF:
                if payload_id not in self.payloads:
                    raise CorruptRecord(f"message {op.message_id} refers to payload {payload_id}, not in the journal")
            elif payload_id not in self.payloads:
                self.payloads[payload_id] = op.payload
                self.refs[payload_id] = 0
                self.live_bytes += len(op.payload)
            node = self.messages.setdefault(op.key, {})
            old = node.get(op.message_id)
            if old is not None:
                self._release(op.key, old, freed)
            node[op.message_id] = StoredMessage(
                op.message_id,
                op.delivery_count,
                self.payloads[payload_id],
                payload_id,
                op.expires_at,
                op.deliver_at,
                op.timed,
            )
            self.refs[payload_id] += 1
            self.live_bytes += _MESSAGE_OVERHEAD + self._key_size(op.key)
            self.message_count += 1
            if payload_id > self.max_message_id or op.message_id > self.max_message_id:
                self.max_message_id = max(op.message_id, payload_id)
        elif kind is Kind.SETTLE:
            messages = self.messages.get(op.key)
            stored = messages.pop(op.message_id, None) if messages is not None else None
            if stored is not None:
                self._release(op.key, stored, freed)
        elif kind is Kind.COUNT:
            stored = self.messages.get(op.key, {}).get(op.message_id)
            if stored is not None:
                stored.delivery_count = op.delivery_count
        elif kind is Kind.SUBSCRIBE:
            old_selector = self.subscriptions.get(op.key)
            if old_selector is not None:
                self.live_bytes -= self._key_size(op.key) + len(old_selector)
            self.subscriptions[op.key] = op.selector
            self.live_bytes += self._key_size(op.key) + len(op.selector)
            if op.shared:
                self.shared.add(op.key)
            else:
                self.shared.discard(op.key)
            self.messages.setdefault(op.key, {})
        elif kind is Kind.UNSUBSCRIBE:
            old_selector = self.subscriptions.pop(op.key, None)
            self.shared.discard(op.key)
            if old_selector is not None:
                self.live_bytes -= self._key_size(op.key) + len(old_selector)
            for stored in self.messages.pop(op.key, {}).values():
                self._release(op.key, stored, freed)
            self._key_sizes.pop(op.key, None)
        else:
            raise CorruptRecord(f"record kind {kind.name} is not an operation")

    def _key_size(self, key: NodeKey) -> int:
        """Bytes of ``key`` in a record (each of its messages repeats it in a snapshot); computed once a key."""
        size = self._key_sizes.get(key)
        if size is None:
            size = self._key_sizes[key] = 1 + sum(4 + len(part.encode("utf-8", "surrogatepass")) for part in key)
        return size

    def _release(self, key: NodeKey, stored: StoredMessage, freed: list[int]) -> None:
        self.live_bytes -= _MESSAGE_OVERHEAD + self._key_size(key)
        self.message_count -= 1
        refs = self.refs[stored.payload_id] - 1
        self.refs[stored.payload_id] = refs
        if refs == 0:
            freed.append(stored.payload_id)

    def live_ops(self) -> Iterator[Op]:
        """Operations that recreate this state (for compaction): each payload written once."""
        return _live_ops(self.capture())

    def capture(self) -> _Capture:
        """What ``live_ops`` needs, taken now (cheap: no message is copied) and read later, in a worker thread
        while the state goes on changing: a message's delivery-count may then be newer than at the capture, which
        the records appended after the capture (replayed after the snapshot) make right anyway."""
        messages = [(key, list(node.values())) for key, node in self.messages.items()]
        return _Capture(dict(self.subscriptions), set(self.shared), messages)


@dataclass
class _Capture:
    subscriptions: dict[NodeKey, str]
    shared: set[NodeKey]
    messages: list[tuple[NodeKey, list[StoredMessage]]]


def _live_ops(capture: _Capture) -> Iterator[Op]:
    for key, selector in capture.subscriptions.items():
        yield Op(Kind.SUBSCRIBE, key, selector=selector, shared=key in capture.shared)
    written: set[int] = set()
    for key, messages in capture.messages:
        for m in messages:
            shared = m.payload_id in written
            written.add(m.payload_id)
            yield Op(
                Kind.ENQUEUE_REF if shared else Kind.ENQUEUE,
                key,
                m.message_id,
                m.delivery_count,
                b"" if shared else m.payload,
                "",
                m.expires_at,
                m.deliver_at,
                0 if m.payload_id == m.message_id else m.payload_id,
                m.timed,
            )


@dataclass
class Compaction:
    """A compaction under way (``Journal.begin_compaction``): its snapshot is written by ``write_snapshot`` (in a
    worker thread), the records appended meanwhile go after it (``finish_compaction``)."""

    number: int
    salt: bytes
    old: list[Path]
    capture: _Capture
    tmp: Path
    tail: list[list[Op]] = field(default_factory=list)
    fd: int | None = None
    size: int = 0
    error: OSError | None = None


# -- reading segments -------------------------------------------------------------------------------------
@dataclass
class _Record:
    offset: int
    end: int
    kind: Kind
    body: bytes


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
    records: list[_Record] = field(default_factory=list)
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


def _record_at(data: bytes | memoryview, pos: int, salt: bytes | None) -> _Record | str:
    """The valid record at ``pos``, or why there is none."""
    size = len(data)
    head = pos
    if salt is not None:
        if size - pos < _SYNC + 9:
            return "an incomplete record"
        if bytes(data[pos : pos + _SYNC]) != salt[:_SYNC]:
            return "no record marker"
        head = pos + _SYNC
    elif size - pos < 9:
        return "an incomplete record"
    length, crc = _RECORD_HEAD.unpack_from(data, head)
    end = head + 4 + length
    if length < 5 or length > MAX_RECORD:
        return f"a bad record length ({length})"
    if end > size:
        return f"a record of {length} bytes running past the end of the file"
    content = data[head + 8 : end]
    if zlib.crc32(content, _seed(salt) if salt is not None else 0) != crc:
        return "a bad checksum"
    if content[0] not in _KIND_BYTES:
        return f"an unknown record kind ({content[0]})"
    return _Record(pos, end, Kind(content[0]), bytes(content[1:]))


_LEGACY_HEAD = re.compile(rb"(?=[\x00-\x40][\s\S]{7}[\x01-\x08])")


def _next_valid(data: bytes, start: int, salt: bytes | None) -> int | None:
    """Where the first valid record at or after ``start`` begins, or None."""
    if salt is not None:
        marker = salt[:_SYNC]
        view = memoryview(data)
        pos = data.find(marker, start)
        while pos != -1:
            if isinstance(_record_at(view, pos, salt), _Record):
                return pos
            pos = data.find(marker, pos + 1)
        return None
    view = memoryview(data)
    for match in _LEGACY_HEAD.finditer(data, start):  # the first format has no marker: try plausible places
        if isinstance(_record_at(view, match.start(), None), _Record):
            return match.start()
    return None


def _damaged_header(data: bytes) -> bool:
    """True when ``data`` (not starting with the magic) is a segment of this format whose first bytes were damaged:
    its header checks out with the magic put back, or a valid record follows it, salted with its salt."""
    if len(data) < _HEADER.size:
        return False
    if zlib.crc32(MAGIC + data[len(MAGIC) : 16]) == _U32.unpack_from(data, 16)[0]:
        return True
    return isinstance(_record_at(memoryview(data), _HEADER.size, data[8:16]), _Record)


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
    if data[: len(MAGIC)] != MAGIC and (not legacy or _damaged_header(data)):
        salt = data[8:16] if len(data) >= _HEADER.size else b"\x00" * 8
        segment = _Segment(path, data, salt, min(len(data), _HEADER.size))
        segment.bad.append(_Bad(0, segment.start if len(data) > _HEADER.size else None, "a damaged segment header"))
    elif data[: len(MAGIC)] == MAGIC:
        if len(data) < _HEADER.size:
            segment = _Segment(path, data, b"\x00" * 8, len(data))
            segment.bad.append(_Bad(0, None, "an incomplete segment header"))
            return segment
        _, version, salt, crc = _HEADER.unpack_from(data, 0)
        if version != VERSION:
            raise JournalError(
                f"journal {path} has format version {version}, which this minibroker cannot read (a newer one wrote it)"
            )
        segment = _Segment(path, data, salt, _HEADER.size)
        if zlib.crc32(data[:16]) != crc:
            # the salt may be damaged too: records will tell (with a bad salt none checks out)
            segment.bad.append(_Bad(0, _HEADER.size, "a bad segment header checksum"))
    else:
        segment = _Segment(path, data, None, 0)
    pos = segment.start
    salt_of = segment.salt
    view = memoryview(data)
    while pos < len(data):
        found = _record_at(view, pos, salt_of)
        if isinstance(found, _Record):
            segment.records.append(found)
            pos = found.end
            continue
        resume = _next_valid(data, pos + 1, salt_of)
        segment.bad.append(_Bad(pos, resume, found))
        if resume is None:
            break
        pos = resume
    return segment


def record_offsets(path: str | Path) -> list[tuple[int, int, Kind]]:
    """(offset, end, kind) of each valid record of a segment file, in order (for tests and tools)."""
    return [(r.offset, r.end, r.kind) for r in _scan(Path(path)).records]


# -- the journal ------------------------------------------------------------------------------------------
RECOVER_MODES = ("strict", "skip-corrupt")


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
        decoded: list[tuple[_Segment, _Record, list[Op]]] = []
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
        dangling: list[tuple[_Segment, _Record, str]] = []
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
                self.ops.fsync(fd)
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
        if len(record) - _SYNC - _RECORD_HEAD.size > MAX_RECORD:
            self._shared = shared
            raise RecordTooLarge(f"a record of {len(record)} bytes is larger than the journal takes ({MAX_RECORD})")
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
            done += n

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
                self.ops.fsync(self._file)
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
            self.ops.fsync(fd)
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
            for chunk in _prepend(segment_header(salt), self._snapshot(salt, _live_ops(compaction.capture))):
                self._write_all(compaction.fd, chunk)
                compaction.size += len(chunk)
            if self.sync_enabled:
                self.ops.fsync(compaction.fd)
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
                self.ops.fsync(fd)
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
            self.ops.fsync(fd)
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
