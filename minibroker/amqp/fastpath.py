"""Fast paths for the performatives of the message hot path: transfer and disposition (Part 2 §2.7.5-6),
and for the transaction path: the declare and discharge a coordinator receives (Part 4 §4.3), and the
dispositions that answer them and transactional posts (``declared``, ``accepted``, ``transactional-state``).

A transfer and its disposition are decoded and encoded once per message, so they get hand-written code
for the encodings real clients use (uint0/smalluint/uint, vbin8 tags, true/false/null flags, the empty
list of ``accepted``). Anything else (an unusual width, a described state other than accepted, a
descriptor by symbol) falls back to the general codec, so these functions only ever return exactly what
the codec would: tests/amqp/test_fastpath.py and test_fastpath_txn.py check that for generated values in
odd-but-legal encodings.
"""

from __future__ import annotations

import struct
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Declare,
    Declared,
    Discharge,
    Disposition,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.sections import AMQP_VALUE, walk
from minibroker.amqp.states import DeliveryState
from minibroker.amqp.types import DecodeError

TRANSFER_PREFIX = b"\x00\x53\x14"
DISPOSITION_PREFIX = b"\x00\x53\x15"
ACCEPTED_BYTES = b"\x00\x53\x24\x45"
ACCEPTED = Accepted()
_TXN_STATE_PREFIX = b"\x00\x53\x34"
_I = struct.Struct(">I")
_BBB = struct.Struct(">BBB")
_BII = struct.Struct(">BII")


class _Fallback(Exception):
    """An encoding this fast path does not handle: use the general codec."""


def _uint(data: bytes, pos: int) -> tuple[int | None, int]:
    code = data[pos]
    if code == 0x52:
        return data[pos + 1], pos + 2
    if code == 0x43:
        return 0, pos + 1
    if code == 0x70:
        return _I.unpack_from(data, pos + 1)[0], pos + 5
    if code == 0x40:
        return None, pos + 1
    raise _Fallback


def _flag(data: bytes, pos: int) -> tuple[bool | None, int]:
    code = data[pos]
    if code == 0x41:
        return True, pos + 1
    if code == 0x42:
        return False, pos + 1
    if code == 0x40:
        return None, pos + 1
    raise _Fallback


def _state(data: bytes, pos: int) -> tuple[Any, int]:
    code = data[pos]
    if code == 0x40:
        return None, pos + 1
    if data[pos : pos + 4] == ACCEPTED_BYTES:
        return ACCEPTED, pos + 4
    if data[pos : pos + 3] == _TXN_STATE_PREFIX:
        # transactional-state(txn-id) with an optional accepted outcome: every transactional transfer and accept
        # carries it, as a list8 (the codec) or a list32 (python-qpid-proton)
        count, at, end = _list_at(data, pos + 3)
        if count and data[at] == 0xA0:
            after = at + 2 + data[at + 1]
            txn_id = data[at + 2 : after]
            if count == 1 and after == end:
                return TransactionalState(txn_id=txn_id), end
            if count == 2 and data[after : after + 4] == ACCEPTED_BYTES and after + 4 == end:
                return TransactionalState(txn_id=txn_id, outcome=ACCEPTED), end
    return codec.decode(data, pos)


# the transactional-state ``_last_state_at`` decoded last, and its bytes (a tuple read and replaced whole, as
# ``_last_state`` below): every post and accept of a transaction carries the same one, decoded once for them all
_last_decoded: tuple[bytes | None, Any] = (None, None)


def _last_state_at(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    """``_state(data, pos)`` for the state that is a performative's last field, ending at ``end``."""
    global _last_decoded
    last_bytes, last_state = _last_decoded
    if data[pos:end] == last_bytes:
        return last_state, end
    state, after = _state(data, pos)
    if after == end and type(state) is TransactionalState and (state.outcome is None or state.outcome is ACCEPTED):
        _last_decoded = (bytes(data[pos:end]), state)  # (a value nobody changes: its txn-id and a shared outcome)
    return state, after


def _list_at(data: bytes, pos: int) -> tuple[int, int, int]:
    """(count, first field offset, end offset) of the list at ``pos``: list0, list8 or list32."""
    code = data[pos]
    if code == 0x45:
        return 0, pos + 1, pos + 1
    if code == 0xC0:
        return data[pos + 2], pos + 3, pos + 2 + data[pos + 1]
    if code == 0xD0:
        return _I.unpack_from(data, pos + 5)[0], pos + 9, pos + 5 + _I.unpack_from(data, pos + 1)[0]
    raise _Fallback


_FLAGS = {0x41: True, 0x42: False, 0x40: None}  # a boolean field's one-byte encodings (a KeyError: another type)


def _middle_table() -> dict[bytes, tuple[Any, ...]]:
    """A transfer's message-format, settled, more and rcv-settle-mode in their one-byte encodings (uint0 or null,
    true/false/null, null), keyed by the bytes of the first 1-4 of them, each value padded to all four."""
    table: dict[bytes, tuple[Any, ...]] = {}
    for fmt, fmt_value in ((0x43, 0), (0x40, None)):
        for settled in _FLAGS:
            for more in _FLAGS:
                encoded, values = bytes((fmt, settled, more, 0x40)), (fmt_value, _FLAGS[settled], _FLAGS[more], None)
                for n in range(1, 5):
                    table[encoded[:n]] = values[:n] + (None,) * (4 - n)
    return table


# every client writes these four fields one byte each: one slice and one lookup read them all, not four reads
_TRANSFER_MIDDLE = _middle_table()


def transfer_fields(body: bytes) -> tuple[Any, ...]:
    """The eleven fields of the transfer performative at the start of ``body`` (as ``Transfer.field_values()``),
    then the offset where its payload starts: a flat tuple, so the engine builds no ``Transfer`` per frame.

    Raises ``DecodeError`` for bad input, exactly like ``codec.decode`` followed by the composite checks.
    """
    try:
        # the fields in order, each read where it stands, the usual widths inline: a helper call per field costs
        # more than the reading (issue 19); any other encoding takes ``_uint``/``_flag`` or the codec
        if body[3] == 0xC0:
            count, pos, end = body[5], 6, 5 + body[4]
        else:
            count, pos, end = _list_at(body, 3)
        if count > 11 or count == 0 or end > len(body):
            raise _Fallback
        handle: int | None
        code = body[pos]  # handle
        if code == 0x52:
            handle, pos = body[pos + 1], pos + 2
        elif code == 0x43:
            handle, pos = 0, pos + 1
        else:
            handle, pos = _uint(body, pos)
        delivery_id = tag = message_format = settled = more = rcv_settle_mode = state = None
        resume = aborted = batchable = None
        if count > 1:  # delivery-id: smalluint, then uint once a session has sent 256
            code = body[pos]
            if code == 0x70:
                delivery_id, pos = _I.unpack_from(body, pos + 1)[0], pos + 5
            elif code == 0x52:
                delivery_id, pos = body[pos + 1], pos + 2
            else:
                delivery_id, pos = _uint(body, pos)
        if count > 2:  # delivery-tag
            code = body[pos]
            if code == 0xA0:
                n = body[pos + 1]
                tag = body[pos + 2 : pos + 2 + n]
                pos += 2 + n
            elif code == 0x40:
                pos += 1
            else:
                raise _Fallback
        if count > 3:
            n = 4 if count > 7 else count - 3
            middle = _TRANSFER_MIDDLE.get(body[pos : pos + n])
            if middle is not None:
                message_format, settled, more, rcv_settle_mode = middle
                pos += n
            else:
                message_format, pos = _uint(body, pos)
                if count > 4:
                    settled, pos = _flag(body, pos)
                if count > 5:
                    more, pos = _flag(body, pos)
                if count > 6:  # rcv-settle-mode
                    code = body[pos]
                    if code == 0x40:
                        pos += 1
                    elif code == 0x50:
                        rcv_settle_mode = body[pos + 1]
                        pos += 2
                    else:
                        raise _Fallback
        if count == 8:
            state, pos = _last_state_at(body, pos, end)
        elif count > 8:
            state, pos = _state(body, pos)
        if count > 8:  # resume, aborted, batchable: one-byte flags
            flags = [_FLAGS[code] for code in body[pos : pos + count - 8]] + [None, None]
            resume, aborted, batchable = flags[0], flags[1], flags[2]
            pos += count - 8
        if pos != end or handle is None:
            raise _Fallback
        return (
            handle,
            delivery_id,
            tag,
            message_format,
            settled,
            more,
            rcv_settle_mode,
            state,
            resume,
            aborted,
            batchable,
            end,
        )
    except (_Fallback, IndexError, KeyError, struct.error):
        value, end = codec.decode(body)
        if not isinstance(value, Transfer):
            raise DecodeError("not a transfer") from None
        return (*value.field_values(), end)


def decode_transfer(body: bytes) -> tuple[Transfer, int]:
    """Decode a transfer performative at the start of ``body``; return it and where the payload starts (see
    ``transfer_fields``)."""
    fields = transfer_fields(body)
    return Transfer(*fields[:11]), fields[11]


def disposition_fields(body: bytes) -> tuple[Any, ...]:
    """The six fields of the disposition performative at the start of ``body``, then its end (see
    ``transfer_fields``)."""
    try:
        # as in ``transfer_fields``: a transactional accept (python-qpid-proton's) carries the first five
        if body[3] == 0xC0:
            count, pos, end = body[5], 6, 5 + body[4]
        else:
            count, pos, end = _list_at(body, 3)
        if count > 6 or count < 2 or end > len(body):  # (role and first are mandatory)
            raise _Fallback
        role = _FLAGS[body[pos]]
        code = body[pos + 1]  # first
        if code == 0x70:
            first, pos = _I.unpack_from(body, pos + 2)[0], pos + 6
        elif code == 0x52:
            first, pos = body[pos + 2], pos + 3
        else:
            first, pos = _uint(body, pos + 1)
        last = settled = state = batchable = None
        if count > 2:
            if body[pos] == 0x40:
                pos += 1
            else:
                last, pos = _uint(body, pos)
        if count > 3:
            settled = _FLAGS[body[pos]]
            pos += 1
        if count == 5:
            state, pos = _last_state_at(body, pos, end)
        elif count > 5:
            state, pos = _state(body, pos)
            batchable = _FLAGS[body[pos]]
            pos += 1
        if pos != end or role is None or first is None:
            raise _Fallback
        return role, first, last, settled, state, batchable, end
    except (_Fallback, IndexError, KeyError, struct.error):
        value, end = codec.decode(body)
        if not isinstance(value, Disposition):
            raise DecodeError("not a disposition") from None
        return (*value.field_values(), end)


def decode_disposition(body: bytes) -> tuple[Disposition, int]:
    """Decode a disposition performative at the start of ``body`` (see ``disposition_fields``)."""
    fields = disposition_fields(body)
    return Disposition(*fields[:6]), fields[6]


def decode_performative(body: bytes) -> tuple[Any, int]:
    """Decode the performative at the start of a frame body (§2.3.2); return it and where the payload starts.

    Transfers and dispositions take the fast paths above, anything else the general codec. Raises
    ``DecodeError`` for bad input.
    """
    prefix = body[:3]
    if prefix == TRANSFER_PREFIX:
        return decode_transfer(body)
    if prefix == DISPOSITION_PREFIX:
        return decode_disposition(body)
    return codec.decode(body)


# the encodings of uints 0-255 (uint0, smalluint), by value: a handle, a disposition's first and a young session's
# delivery-ids are small, and a table lookup costs less than building the two bytes (issue 19)
_SMALL_UINTS = (b"\x43", *(bytes((0x52, value)) for value in range(1, 256)))


def _uint_bytes(value: int) -> bytes:
    if 0 <= value < 256:
        return _SMALL_UINTS[value]
    return b"\x70" + _I.pack(value)


def encode_transfer(
    handle: int,
    delivery_id: int | None,
    tag: bytes | None,
    message_format: int | None,
    settled: bool | None,
    more: bool,
    state: DeliveryState | None = None,
) -> bytes:
    """The encoded transfer performative (trailing nulls trimmed), as ``codec.encode(Transfer(...))``."""
    if (
        delivery_id is not None
        and tag is not None
        and len(tag) < 240
        and state is None
        and not (more or message_format)
    ):
        # a whole message in one frame, no state (all the broker sends but large messages): its five fields in one
        # join, a list8 (a tag under 240 octets keeps it under 256) (issue 19)
        body = b"".join(
            (
                _uint_bytes(handle),
                _uint_bytes(delivery_id),
                bytes((0xA0, len(tag))),
                tag,
                b"\x43\x41" if settled else b"\x43\x42",
            )
        )
        return TRANSFER_PREFIX + _BBB.pack(0xC0, len(body) + 1, 5) + body
    parts = [_uint_bytes(handle)]
    if delivery_id is not None:
        parts.append(_uint_bytes(delivery_id))
        parts.append(bytes((0xA0, len(tag))) + tag if tag is not None and len(tag) < 256 else codec.encode(tag))
        parts.append(_uint_bytes(message_format or 0))
        parts.append(b"\x41" if settled else b"\x42")
    elif more or state is not None:
        parts.append(b"\x40\x40\x40\x40")
    if more or state is not None:
        parts.append(b"\x41" if more else b"\x40")
    if state is not None:
        parts.append(b"\x40")  # rcv-settle-mode
        parts.append(ACCEPTED_BYTES if state is ACCEPTED else codec.encode(state))
    body = b"".join(parts)
    count = 1 + (4 if delivery_id is not None or more or state is not None else 0)
    count += (1 if more or state is not None else 0) + (2 if state is not None else 0)
    if len(body) + 1 < 256 and count < 256:
        return TRANSFER_PREFIX + _BBB.pack(0xC0, len(body) + 1, count) + body
    return TRANSFER_PREFIX + _BII.pack(0xD0, len(body) + 4, count) + body


_TRANSFER_FIELDS = 11  # handle ... batchable (§2.7.5)


def encode_transfer_all_fields(
    handle: int,
    delivery_id: int | None,
    tag: bytes | None,
    message_format: int | None,
    settled: bool | None,
    more: bool,
    state: DeliveryState | None = None,
) -> bytes:
    """As ``encode_transfer``, with all eleven fields (the trailing ones null): azure-eventhub 5.x
    ``_pyamqp/_decode.py`` ``decode_frame`` appends the payload after the fields it finds, and
    ``_pyamqp/receiver.py`` reads it as the twelfth."""
    short = encode_transfer(handle, delivery_id, tag, message_format, settled, more, state)
    at = len(TRANSFER_PREFIX)
    if short[at] == 0xC0:
        count, body = short[at + 2], short[at + 3 :]
    else:
        count, body = _I.unpack_from(short, at + 5)[0], short[at + 9 :]
    body += b"\x40" * (_TRANSFER_FIELDS - count)
    if len(body) + 1 < 256:
        return TRANSFER_PREFIX + _BBB.pack(0xC0, len(body) + 1, _TRANSFER_FIELDS) + body
    return TRANSFER_PREFIX + _BII.pack(0xD0, len(body) + 4, _TRANSFER_FIELDS) + body


# -- the transaction path (Part 4) -----------------------------------------------------------------------
_AMQP_VALUE_PREFIX = b"\x00\x53\x77"
_DECLARE_PREFIX = b"\x00\x53\x31"
_DISCHARGE_PREFIX = b"\x00\x53\x32"
_DECLARED_PREFIX = b"\x00\x53\x33"
_DISCHARGE_FLAGS = {0x41: True, 0x42: False, 0x40: None}


# a coordinator message's leading sections as python-qpid-proton writes every message: an empty header and an
# empty properties (list0), which the fast path steps over rather than hand the message to the codec
_EMPTY_HEADER = b"\x00\x53\x70\x45"
_EMPTY_PROPERTIES = b"\x00\x53\x73\x45"
# the control's descriptor: smallulong (most clients), or the symbol python-qpid-proton and rhea write
_CONTROL_KINDS = {
    _DECLARE_PREFIX: _DECLARE_PREFIX,
    _DISCHARGE_PREFIX: _DISCHARGE_PREFIX,
    b"\x00\xa3\x11amqp:declare:list": _DECLARE_PREFIX,
    b"\x00\xa3\x13amqp:discharge:list": _DISCHARGE_PREFIX,
}


def _control_kind(payload: bytes, pos: int) -> tuple[bytes, int]:
    """The control's kind (``_DECLARE_PREFIX`` or ``_DISCHARGE_PREFIX``) from its descriptor at ``pos``, and the
    offset after the descriptor."""
    end = pos + 3 + payload[pos + 2] if payload[pos + 1] == 0xA3 else pos + 3
    kind = _CONTROL_KINDS.get(bytes(payload[pos:end]))  # (bytes: a bytearray slice is no dict key)
    if kind is None:
        raise _Fallback
    return kind, end


def _fast_control(payload: bytes) -> Any:
    """The declare or discharge of a payload that is one amqp-value section of the compact encodings, maybe after
    an empty header and an empty properties section."""
    pos = 4 if payload[:4] == _EMPTY_HEADER else 0
    if payload[pos : pos + 4] == _EMPTY_PROPERTIES:
        pos += 4
    if payload[pos : pos + 3] != _AMQP_VALUE_PREFIX:
        raise _Fallback
    kind, pos = _control_kind(payload, pos + 3)
    count, pos, end = _list_at(payload, pos)
    if end > len(payload):
        raise _Fallback
    if kind == _DECLARE_PREFIX:
        if count > 1 or (count == 1 and payload[pos] != 0x40) or pos + count != end:
            raise _Fallback
        return Declare()
    if count not in (1, 2):
        raise _Fallback
    code = payload[pos]
    if code == 0xA0:
        n, at = payload[pos + 1], pos + 2
    elif code == 0xB0:
        n, at = _I.unpack_from(payload, pos + 1)[0], pos + 5
    else:
        raise _Fallback
    txn_id, pos = bytes(payload[at : at + n]), at + n  # bytes, as the codec gives: a txn-id is a dict key
    fail = _DISCHARGE_FLAGS[payload[pos]] if count == 2 else None  # KeyError: another type, the codec says what
    if pos + count - 1 != end:
        raise _Fallback
    return Discharge(txn_id=txn_id, fail=fail)


def control_value(payload: bytes) -> Any:
    """The value of the first amqp-value section of a coordinator message (§4.3), or None when it has none.

    Only that section (and the sections before it) is decoded; ``DecodeError`` when it does not decode. A
    declare or discharge in its usual encoding is decoded here without the general codec (one per transaction
    each: Part 4's hot path); any other takes ``control_value_general``, which gives the same.
    """
    try:
        return _fast_control(payload)
    except (_Fallback, IndexError, KeyError, struct.error):
        return control_value_general(payload)


def control_value_general(payload: bytes) -> Any:
    """``control_value`` by the general codec."""
    for section in walk(payload):
        if section.code == AMQP_VALUE:
            value = codec.decode(payload, section.start)[0]
            return value.value if isinstance(value, AmqpValue) else None
    return None


def _binary_bytes(value: bytes) -> bytes:
    return bytes((0xA0, len(value))) + value if len(value) < 256 else b"\xb0" + _I.pack(len(value)) + value


def _list_bytes(prefix: bytes, count: int, body: bytes) -> bytes:
    """A described list (``prefix``: its descriptor) as the codec writes it: list8 when it fits, else list32."""
    if len(body) + 1 < 256:
        return prefix + _BBB.pack(0xC0, len(body) + 1, count) + body
    return prefix + _BII.pack(0xD0, len(body) + 4, count) + body


def state_bytes(state: Any) -> bytes | None:
    """The encoding of a delivery state the transaction path sends (``accepted``, ``declared``, a
    ``transactional-state`` with no outcome or ``accepted``) built without the codec, or None for any other."""
    kind = type(state)
    if kind is Accepted:
        return ACCEPTED_BYTES
    if kind is TransactionalState:
        txn_id, outcome = state.txn_id, state.outcome
        if type(txn_id) is bytes:
            if outcome is None:
                return _list_bytes(_TXN_STATE_PREFIX, 1, _binary_bytes(txn_id))
            if type(outcome) is Accepted:
                return _list_bytes(_TXN_STATE_PREFIX, 2, _binary_bytes(txn_id) + ACCEPTED_BYTES)
    elif kind is Declared and type(state.txn_id) is bytes:
        return _list_bytes(_DECLARED_PREFIX, 1, _binary_bytes(state.txn_id))
    return None


# the state ``encode_disposition`` encoded last and its bytes (the state held, so its identity is not reused); one
# tuple, read and replaced whole, so two brokers in threads of one process never pair one's state with other's bytes
_last_state: tuple[Any, bytes] = (None, b"")


def encode_disposition(role: bool, first: int, last: int | None, settled: bool, state: Any) -> bytes | None:
    """The encoded disposition performative, as ``codec.encode(Disposition(role, UInt(first), ...))``, or None
    when ``state`` is not one ``state_bytes`` builds (then the caller uses the codec)."""
    global _last_state
    last_state, last_bytes = _last_state
    if state is None:
        tail = b""
    elif state is last_state:  # a transaction's posts share one provisional state: encoded once for them all
        tail = last_bytes
    else:
        encoded = state_bytes(state)
        if encoded is None:
            return None
        tail = encoded
        _last_state = (state, encoded)
    body = b"".join(
        (
            b"\x41" if role else b"\x42",
            _uint_bytes(first),
            b"\x40" if last is None else _uint_bytes(last),
            b"\x41" if settled else b"\x42",
            tail,
        )
    )
    return _list_bytes(DISPOSITION_PREFIX, 5 if tail else 4, body)
