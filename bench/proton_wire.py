"""The octets python-qpid-proton (0.39, 0.40) writes for a transaction's frames, so that the benchmarks that do not run
proton itself (``bench.cost``, ``bench.floor``, ``bench.perf``'s raw transaction scenarios) send exactly what it
sends (captured from ``bench.perf_client``'s transaction scenarios with ``--trace-frames`` and a socket tap).

Where proton's encoding differs from minibroker's codec it matters to the broker's fast paths: proton writes a
coordinator message's descriptor as a symbol and its list as a list32, and a transactional-state as a list32;
its messages begin with an empty header and an empty properties section. Its delivery-tags count each link's
deliveries in decimal from "1" (``Link.delivery_tag``), and a transfer outside a transaction (a declare, a
discharge) stops after message-format: four fields, no settled flag.
"""

from __future__ import annotations

import struct

DECLARE_NAME = b"amqp:declare:list"
DISCHARGE_NAME = b"amqp:discharge:list"
WINDOW = 0x7FFFFFFF
"""A proton session's incoming and outgoing windows (its ``begin``)."""
READ_SIZE = 8192
"""What proton's reactor reads at most at a time: its transport's input buffer, less the partial frame it holds
(reads of 8192, 8126, 8127 bytes under ``strace`` while ``txn_accept_100`` takes its deliveries), each read's
deliveries accepted and written before the next read."""


def message(body: bytes) -> bytes:
    """``Message(body=body)`` with ``body`` binary, as proton encodes it: an empty header, empty properties, then
    the amqp-value."""
    return b"\x00\x53\x70\x45\x00\x53\x73\x45\x00\x53\x77" + struct.pack(">BI", 0xB0, len(body)) + body


def control(name: bytes, fields: bytes, count: int) -> bytes:
    """A coordinator message (``Message(body=Described(symbol(name), [...]))``): an empty header and properties,
    then the amqp-value, its descriptor the symbol ``name``, its list (``count`` encoded ``fields``) a list32."""
    head = b"\x00\x53\x70\x45\x00\x53\x73\x45\x00\x53\x77\x00\xa3" + bytes((len(name),)) + name
    return head + struct.pack(">BII", 0xD0, len(fields) + 4, count) + fields


def declare() -> bytes:
    """The message carrying ``declare`` (no global-id)."""
    return control(DECLARE_NAME, b"\x40", 1)


def discharge(txn_id: bytes, fail: bool = False) -> bytes:
    """The message carrying ``discharge`` of ``txn_id``."""
    return control(DISCHARGE_NAME, _binary(txn_id) + (b"\x41" if fail else b"\x42"), 2)


def txn_state(txn_id: bytes, accepted: bool) -> bytes:
    """A transactional-state of ``txn_id``, with ``accepted`` as its outcome or none: a list32."""
    fields = _binary(txn_id) + (b"\x00\x53\x24\x45" if accepted else b"")
    return b"\x00\x53\x34" + struct.pack(">BII", 0xD0, len(fields) + 4, 1 + accepted) + fields


def transfer(handle: int, delivery_id: int, tag: bytes, payload: bytes) -> bytes:
    """The frame body of an unsettled transfer outside a transaction (a declare, a discharge) of the encoded
    message ``payload``: four fields, message-format 0 the last."""
    fields = _uint(handle) + _uint(delivery_id) + _binary(tag) + b"\x43"
    return b"\x00\x53\x14" + bytes((0xC0, len(fields) + 1, 4)) + fields + payload


def txn_post(handle: int, delivery_id: int, txn_id: bytes, payload: bytes, *, tag: bytes) -> bytes:
    """The frame body of a transactional post of the encoded message ``payload``: a transfer of eight fields
    (message-format 0; the three fields before the state null), its state a ``txn_state``."""
    fields = _uint(handle) + _uint(delivery_id) + _binary(tag) + b"\x43\x40\x40\x40" + txn_state(txn_id, False)
    return b"\x00\x53\x14" + bytes((0xC0, len(fields) + 1, 8)) + fields + payload


def txn_accept(delivery_id: int, txn_id: bytes, *, settled: bool) -> bytes:
    """The frame body of a receiver's disposition accepting ``delivery_id`` in ``txn_id`` (``Transaction.accept``):
    five fields, last null; ``settled`` as a transaction declared with ``settle_before_discharge`` writes it (the
    delivery settled with its accept; without it, proton 0.40 never settles it)."""
    fields = b"\x41" + _uint(delivery_id) + b"\x40" + (b"\x41" if settled else b"\x42") + txn_state(txn_id, True)
    return b"\x00\x53\x15" + bytes((0xC0, len(fields) + 1, 5)) + fields


def flow(next_incoming_id: int, next_outgoing_id: int, handle: int, delivery_count: int, credit: int) -> bytes:
    """The frame body of a receiver's ``Receiver.flow(credit)``: nine fields, both windows ``WINDOW`` (proton's
    session default), available null, drain false."""
    window = _uint(WINDOW)
    fields = _uint(next_incoming_id) + window + _uint(next_outgoing_id) + window
    fields += _uint(handle) + _uint(delivery_count) + _uint(credit) + b"\x40\x42"
    return b"\x00\x53\x13" + bytes((0xC0, len(fields) + 1, 9)) + fields


def _uint(value: int) -> bytes:
    """A uint in its shortest form (uint0, smalluint or uint), as proton writes it."""
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + bytes((value,))
    return b"\x70" + value.to_bytes(4, "big")


def _binary(value: bytes) -> bytes:
    return b"\xa0" + bytes((len(value),)) + value
