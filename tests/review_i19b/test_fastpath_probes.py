"""Adversarial review (b) of issue 19's frame decoding: the flat-tuple transfer/disposition readers and the
module-level cache of the last transactional-state (``fastpath._last_state_at``), checked against the general codec
(AMQP 1.0 Part 2 §2.7.5 transfer, §2.7.6 disposition; Part 4 §4.5.5 transactional-state), and the one caller that
changes a decoded performative in place (``replay._substituted``, whose ``_swapped`` assumed fresh objects)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from minibroker import replay
from minibroker.amqp import codec, fastpath
from minibroker.amqp.definitions import Accepted, Disposition, TransactionalState, Transfer
from minibroker.amqp.framing import encode_frame
from minibroker.amqp.types import DecodeError

pytestmark = pytest.mark.timeout(30)

TRANSFER = b"\x00\x53\x14"
DISPOSITION = b"\x00\x53\x15"


def list8(count: int, fields: bytes, size_delta: int = 0) -> bytes:
    if len(fields) + 1 + size_delta > 255:  # (too long for a list8: the list32 it must be)
        return list32(count, fields, size_delta)
    return bytes((0xC0, len(fields) + 1 + size_delta, count)) + fields


def list32(count: int, fields: bytes, size_delta: int = 0) -> bytes:
    return b"\xd0" + struct.pack(">II", len(fields) + 4 + size_delta, count) + fields


def vbin(data: bytes) -> bytes:
    if len(data) < 256:
        return bytes((0xA0, len(data))) + data
    return b"\xb0" + struct.pack(">I", len(data)) + data


def txn_state(txn_id: bytes, accepted: bool = False, *, wide: bool = False, **lie: int) -> bytes:
    fields = vbin(txn_id) + (b"\x00\x53\x24\x45" if accepted else b"")
    count = 2 if accepted else 1
    make = list32 if wide else list8
    return b"\x00\x53\x34" + make(lie.get("count", count), fields, lie.get("size", 0))


def vbin32(data: bytes) -> bytes:
    return b"\xb0" + struct.pack(">I", len(data)) + data


def transfer_body(
    state: bytes, *, tail: bytes = b"", count: int = 8, fmt: bytes = b"\x43", wide: bool = False
) -> bytes:
    fields = b"\x43" + b"\x52\x07" + vbin(b"tag") + fmt + b"\x42" + b"\x42" + b"\x40" + state + tail
    return TRANSFER + (list32 if wide else list8)(count, fields) + b"\x00\x53\x77\xa1\x01x"


def disposition_body(state: bytes, *, first: bytes = b"\x52\x03", last: bytes = b"\x40", tail: bytes = b"") -> bytes:
    fields = b"\x41" + first + last + b"\x41" + state + tail
    return DISPOSITION + list8(6 if tail else 5, fields)


def reference(body: bytes, kind: type) -> Any:
    """What the general codec makes of ``body``: its fields and end, or the DecodeError class."""
    value: Any
    try:
        value, end = codec.decode(body)
    except DecodeError:
        return DecodeError
    if not isinstance(value, kind):
        return DecodeError
    return (*value.field_values(), end)


def fast(body: bytes, reader: Any) -> Any:
    try:
        return reader(body)
    except DecodeError:
        return DecodeError


IDS = [b"", b"\x01", b"txn:1", b"x" * 32, b"y" * 255]
STATES = [
    *(txn_state(i) for i in IDS),
    *(txn_state(i, accepted=True) for i in IDS if len(i) < 250),
    *(txn_state(i, wide=True) for i in IDS),
    *(txn_state(i, accepted=True, wide=True) for i in IDS),
    txn_state(b"ab", wide=True, count=2),  # list32 whose count says two fields, one given
    txn_state(b"ab", wide=True, count=0),
    txn_state(b"ab", wide=True, size=1),  # a size one past its fields
    txn_state(b"ab", wide=True, size=-1),
    txn_state(b"ab", count=2),
    txn_state(b"ab", size=1),
    txn_state(b"ab", accepted=True, count=1),  # an outcome the count leaves out
    b"\x00\x53\x34" + list32(1, vbin32(b"ab")),  # a vbin32 txn-id
    b"\x00\x53\x34" + list8(1, vbin32(b"ab")),
    b"\x00\x53\x34\x45",  # transactional-state list0: txn-id missing
    b"\x00\x53\x34" + list8(2, vbin(b"ab") + b"\x00\x53\x25\x45"),  # rejected outcome
    b"\x00\x53\x34" + list8(2, vbin(b"ab") + b"\x40"),
    b"\x00\x53\x24\x45",
    b"\x40",
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("tail", [b"", b"\x42", b"\x42\x41", b"\x41\x42\x40", b"\x56\x01"])
def test_transfer_fields_as_codec(state: bytes, tail: bytes) -> None:
    """§2.7.5: every transfer, whatever its state's encoding and whatever follows it, reads as the codec reads it
    (twice: the second read is the cache's), and two different bodies never share a decoded txn-id wrongly."""
    count = 8 + (len(tail) if tail != b"\x56\x01" else 1)
    for wide in (False, True):
        body = transfer_body(state, tail=tail, count=count, wide=wide)
        expected = reference(body, Transfer)
        assert fast(body, fastpath.transfer_fields) == expected
        assert fast(body, fastpath.transfer_fields) == expected  # (now from the cache, when cached)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(
    ("first", "last"),
    [
        (b"\x52\x03", b"\x40"),
        (b"\x43", b"\x52\x05"),
        (b"\x52\x09", b"\x52\x02"),  # first > last
        (b"\x43", b"\x70\xff\xff\xff\xff"),  # a huge last
        (b"\x40", b"\x40"),  # first (mandatory) null
        (b"\x70\x00\x00\x01\x00", b"\x43"),
        (b"\x80" + bytes(8), b"\x40"),  # a ulong first: another type
    ],
)
def test_disposition_fields_as_codec(state: bytes, first: bytes, last: bytes) -> None:
    """§2.7.6: a disposition with any state and range (first > last, a huge last) reads as the codec reads it."""
    for tail in (b"", b"\x42"):
        body = disposition_body(state, first=first, last=last, tail=tail)
        expected = reference(body, Disposition)
        assert fast(body, fastpath.disposition_fields) == expected
        assert fast(body, fastpath.disposition_fields) == expected


@pytest.mark.parametrize("fmt", [b"\x52\x01", b"\x70\x00\x00\x00\x00", b"\x70\x80\x01\x02\x03", b"\x40"])
def test_message_format_as_codec(fmt: bytes) -> None:
    """§2.7.5 message-format: a non-zero or wide one reads as the codec reads it, with the cache warm."""
    state = txn_state(b"txn:1")
    body = transfer_body(state, fmt=fmt)
    assert fast(body, fastpath.transfer_fields) == reference(body, Transfer)


def test_cache_hit_on_a_truncated_frame() -> None:
    """A frame cut short right where a cached state would end is refused, not read from the cache."""
    state = txn_state(b"txn:1")
    fastpath.transfer_fields(transfer_body(state))  # warm the cache
    whole = transfer_body(state)
    for cut in range(len(whole) - 8, len(whole)):
        body = whole[:cut]
        assert fast(body, fastpath.transfer_fields) == reference(body, Transfer)


def test_replay_substitution_leaves_the_decoded_state_alone() -> None:
    """``replay._substituted`` re-encodes a frame whose txn-id changes length by changing the decoded performative
    in place; the transactional-state it changes is the one the fast path hands out again for the same bytes
    (``_last_state_at``, shared across connections), so every later read of those bytes -- a broker in the same
    process included -- would name the replacement txn-id instead of the one on the wire (Part 4 §4.5.5)."""
    captured, replayed = b"txn:1", b"txn:1000"
    frame = encode_frame(
        1,
        Transfer(
            handle=0,
            delivery_id=7,
            delivery_tag=b"t",
            message_format=0,
            settled=False,
            more=False,
            state=TransactionalState(txn_id=captured),
        ),
        b"\x00\x53\x77\xa1\x01x",
    )
    body = frame[8:]
    fastpath.transfer_fields(body)  # the broker (or anyone in the process) reads the frame: cached
    swapped = replay._substituted(frame, [(captured, replayed)])
    assert codec.decode(swapped[8:])[0].state == TransactionalState(txn_id=replayed)
    again = fastpath.transfer_fields(body)
    assert again[7] == TransactionalState(txn_id=captured)
    assert fastpath.decode_transfer(body)[0].state == TransactionalState(txn_id=captured)


def test_replay_substitution_of_a_disposition() -> None:
    """As above, a transactional accept (disposition, Part 4 §4.4.2) read twice through the replay."""
    captured, replayed = b"\x00\x01", b"\x00\x00\x00\x02"
    frame = encode_frame(
        1, Disposition(role=True, first=3, settled=True, state=TransactionalState(txn_id=captured, outcome=Accepted()))
    )
    body = frame[8:]
    for _ in range(2):
        swapped = replay._substituted(frame, [(captured, replayed)])
        assert codec.decode(swapped[8:])[0].state.txn_id == replayed
        assert fastpath.disposition_fields(body)[4] == TransactionalState(txn_id=captured, outcome=Accepted())


def _transfer(*fields: bytes) -> bytes:
    return TRANSFER + list8(len(fields), b"".join(fields)) + b"\x00\x53\x77\xa1\x01x"


def _disposition(*fields: bytes) -> bytes:
    return DISPOSITION + list8(len(fields), b"".join(fields))


STATE = txn_state(b"txn:1")
ODD_TRANSFERS = [
    _transfer(b"\x43", b"\x43", vbin(b"t"), b"\x43", b"\x56\x01", b"\x56\x00", b"\x40", STATE),  # boolean with a byte
    _transfer(b"\x43", b"\x43", vbin(b"t"), b"\x43", b"\x42", b"\x42", b"\x50\x01", STATE),  # rcv-settle-mode second
    _transfer(b"\x43", b"\x43", vbin(b"t"), b"\x43", b"\x42", b"\x42", b"\x50\x07", STATE),
    _transfer(b"\x70\x00\x00\x01\x00", b"\x40", b"\x40", b"\x40", b"\x40", b"\x41", b"\x40", STATE),  # a continuation
    _transfer(b"\x43", b"\x43", vbin32(b"t"), b"\x43", b"\x42", b"\x42", b"\x40", STATE),  # a vbin32 tag
    _transfer(b"\x40", b"\x43", vbin(b"t")),  # handle (mandatory) null
    _transfer(b"\x43"),
    _transfer(b"\x43", b"\x43", vbin(b"t"), b"\x52\x01", b"\x42", b"\x42", b"\x40", STATE, b"\x40", b"\x41"),  # aborted
    _transfer(b"\x43", b"\x43", vbin(b"t"), b"\x43", b"\x42", b"\x42", b"\x40", STATE, b"\x43"),  # resume not a bool
]
ODD_DISPOSITIONS = [
    _disposition(b"\x56\x01", b"\x43", b"\x40", b"\x56\x00", STATE),
    _disposition(b"\x40", b"\x43", b"\x40", b"\x41", STATE),  # role (mandatory) null
    _disposition(b"\x41", b"\x43", b"\x40", b"\x40", STATE),
    _disposition(b"\x41", b"\x43", b"\x40", b"\x41", STATE, b"\x52\x01"),  # batchable not a bool
    _disposition(b"\x41", b"\x43"),
    _disposition(b"\x41"),
]


@pytest.mark.parametrize("body", ODD_TRANSFERS)
def test_odd_transfers_as_codec(body: bytes) -> None:
    """§2.7.5: odd but possible encodings of each field read as the codec reads them (or fail as it does)."""
    assert fast(body, fastpath.transfer_fields) == reference(body, Transfer)
    assert fast(body, fastpath.transfer_fields) == reference(body, Transfer)


@pytest.mark.parametrize("body", ODD_DISPOSITIONS)
def test_odd_dispositions_as_codec(body: bytes) -> None:
    """§2.7.6: as above for a disposition."""
    assert fast(body, fastpath.disposition_fields) == reference(body, Disposition)
    assert fast(body, fastpath.disposition_fields) == reference(body, Disposition)
