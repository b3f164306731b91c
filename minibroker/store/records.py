"""The journal's record format: operations on durable state, their encoding, and the framing of records in a
segment. Pure: bytes in, values out (no file, no clock, no thread), so the broker core may use it.

A segment starts with a header: a magic, the format version and 8 random bytes (the segment's *salt*),
checksummed. Then records::

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
ENQUEUE_REF records naming that id. Several operations applied together are one TXN record.

What the operations add up to is ``store/state.py``; reading and writing segment files is ``store/journal.py``.
"""

from __future__ import annotations

import logging
import re
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

log = logging.getLogger("minibroker.store")

RECORD_HEAD = struct.Struct(">II")  # length, crc32
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
MAX_RECORD = 1 << 30
"""The largest record recovery reads back (bytes after the length field): larger ones are never written."""
MAGIC = b"MBJL"
VERSION = 2
HEADER = struct.Struct(">4sI8sI")  # magic, version, salt, crc32 of the 16 bytes before it
SYNC = 4  # bytes of the sync marker in front of a record of a salted segment
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
_KIND_BYTES = frozenset(int(k) for k in Kind)
_HAS_EXPIRY, _HAS_DELIVERY, _UNTIMED = 1, 2, 4
_SHARED = 1  # SUBSCRIBE flags


class CorruptRecord(Exception):
    """A record body that does not parse (a bug, or a disk error past the checksum)."""


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


def seed(salt: bytes) -> int:
    """The starting value of the checksums of a segment salted with ``salt``."""
    return zlib.crc32(salt)


def encode_record(kind: Kind, body: bytes, salt: bytes | None = None) -> bytes:
    """One framed, checksummed record; with ``salt``, as in a segment with that salt (else headerless)."""
    kind_byte = bytes([kind])
    if salt is None:
        crc = zlib.crc32(body, zlib.crc32(kind_byte))
        return b"".join((RECORD_HEAD.pack(len(body) + 5, crc), kind_byte, body))
    crc = zlib.crc32(body, zlib.crc32(kind_byte, seed(salt)))
    return b"".join((salt[:SYNC], RECORD_HEAD.pack(len(body) + 5, crc), kind_byte, body))


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


# -- reading records -----------------------------------------------------------------------------------
@dataclass
class Record:
    """A valid record found in a segment's bytes: where it starts and ends, its kind and its body."""

    offset: int
    end: int
    kind: Kind
    body: bytes


def record_at(data: bytes | memoryview, pos: int, salt: bytes | None) -> Record | str:
    """The valid record at ``pos``, or why there is none."""
    size = len(data)
    head = pos
    if salt is not None:
        if size - pos < SYNC + 9:
            return "an incomplete record"
        if bytes(data[pos : pos + SYNC]) != salt[:SYNC]:
            return "no record marker"
        head = pos + SYNC
    elif size - pos < 9:
        return "an incomplete record"
    length, crc = RECORD_HEAD.unpack_from(data, head)
    end = head + 4 + length
    if length < 5 or length > MAX_RECORD:
        return f"a bad record length ({length})"
    if end > size:
        return f"a record of {length} bytes running past the end of the file"
    content = data[head + 8 : end]
    if zlib.crc32(content, seed(salt) if salt is not None else 0) != crc:
        return "a bad checksum"
    if content[0] not in _KIND_BYTES:
        return f"an unknown record kind ({content[0]})"
    return Record(pos, end, Kind(content[0]), bytes(content[1:]))


_LEGACY_HEAD = re.compile(rb"(?=[\x00-\x40][\s\S]{7}[\x01-\x08])")


def next_valid(data: bytes, start: int, salt: bytes | None) -> int | None:
    """Where the first valid record at or after ``start`` begins, or None."""
    if salt is not None:
        marker = salt[:SYNC]
        view = memoryview(data)
        pos = data.find(marker, start)
        while pos != -1:
            if isinstance(record_at(view, pos, salt), Record):
                return pos
            pos = data.find(marker, pos + 1)
        return None
    view = memoryview(data)
    for match in _LEGACY_HEAD.finditer(data, start):  # the first format has no marker: try plausible places
        if isinstance(record_at(view, match.start(), None), Record):
            return match.start()
    return None


def damaged_header(data: bytes) -> bool:
    """True when ``data`` (not starting with the magic) is a segment of this format whose first bytes were damaged:
    its header checks out with the magic put back, or a valid record follows it, salted with its salt."""
    if len(data) < HEADER.size:
        return False
    if zlib.crc32(MAGIC + data[len(MAGIC) : 16]) == _U32.unpack_from(data, 16)[0]:
        return True
    return isinstance(record_at(memoryview(data), HEADER.size, data[8:16]), Record)
