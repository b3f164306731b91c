"""Probe of the fast transfer reader on a multi-frame transactional post (Part 2 §2.6.14 more, §2.7.5 state: "the
state MAY be sent on any transfer of the delivery"; Part 4 §4.4.1) whose transactional-state is python-qpid-proton's
list32 (the form the reader now takes itself, and caches), on the first frame only, the last only, or every one."""

from __future__ import annotations

import struct

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Disposition, TransactionalState, Transfer
from minibroker.amqp.framing import AMQP_FRAME, FRAME_HEADER
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker.test_transactions_frames import body, client

pytestmark = pytest.mark.timeout(30)


def list32_state(txn_id: bytes) -> bytes:
    fields = bytes((0xA0, len(txn_id))) + txn_id
    return b"\x00\x53\x34\xd0" + struct.pack(">II", len(fields) + 4, 1) + fields


def transfer_frame(delivery_id: int | None, more: bool, state: bytes | None, chunk: bytes) -> bytes:
    first = delivery_id is not None
    fields = b"\x52\x01" + (
        (bytes((0x52, delivery_id)) + b"\xa0\x01t" + b"\x43" + b"\x42") if first else b"\x40\x40\x40\x40"
    )
    fields += b"\x41" if more else b"\x42"
    count = 6
    if state is not None:
        fields += b"\x40" + state
        count = 8
    if len(fields) < 255:
        listed = bytes((0xC0, len(fields) + 1, count)) + fields
    else:
        listed = b"\xd0" + struct.pack(">II", len(fields) + 4, count) + fields
    body_ = b"\x00\x53\x14" + listed + chunk
    return FRAME_HEADER.pack(8 + len(body_), 2, AMQP_FRAME, 0) + body_


@pytest.mark.parametrize("state_on", ["first", "last", "every"])
async def test_multi_frame_post_with_a_list32_state(mb: MemoryBroker, autojump_clock: MockClock, state_on: str) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    state = list32_state(txn)
    payload = frames.message("three pieces of one message")
    pieces = [payload[:10], payload[10:20], payload[20:]]
    delivery_id = c.next_id()
    for n, chunk in enumerate(pieces):
        last = n == len(pieces) - 1
        carries = state_on == "every" or (state_on == "first" and n == 0) or (state_on == "last" and last)
        await c.peer.send_raw(
            transfer_frame(delivery_id if n == 0 else None, not last, state if carries else None, chunk)
        )
    got = await c.peer.expect(Disposition)
    assert (got.first, got.state) == (delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()))
    assert mb.queue("q").depth == 0  # staged, invisible until the commit
    assert await c.discharge(txn) == Accepted()
    await c.receiver("q", 2)
    await c.credit(2, 1)
    delivered = await c.peer.expect_frame(Transfer)
    assert delivered.payload == payload
    assert body(delivered.payload) == "three pieces of one message"
    await c.peer.disposition(delivered.performative.delivery_id, state=Accepted())


@pytest.mark.parametrize("txn_id", [b"", b"\x00" * 32, b"y" * 255], ids=["empty", "32-octets", "255-octets"])
async def test_post_naming_an_odd_unknown_txn_id(mb: MemoryBroker, autojump_clock: MockClock, txn_id: bytes) -> None:
    """Part 4 §4.5.5: a post whose list32 transactional-state names no declared transaction (empty, 32 octets, or
    longer than any txn-id the broker gives) is rejected with transaction:unknown-id, and the link goes on: the
    connection's real transaction still commits its post."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    bad = c.next_id()
    await c.peer.send_raw(transfer_frame(bad, False, list32_state(txn_id), frames.message("stray")))
    got = await c.peer.expect(Disposition)
    assert got.first == bad
    assert got.state.error.condition == "amqp:transaction:unknown-id"
    good = c.next_id()
    await c.peer.send_raw(transfer_frame(good, False, list32_state(txn), frames.message("kept")))
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert await c.discharge(txn) == Accepted()
    assert mb.queue("q").depth == 1
