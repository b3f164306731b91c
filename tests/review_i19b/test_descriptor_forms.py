"""Probe of issue 19's per-frame dispatch (``ServerConnection._on_frame``): a transfer or disposition whose
descriptor is written as a ulong (0x80) or a symbol (``amqp:transfer:list``) rather than the smallulong (0x53)
the fast readers look for is as valid (AMQP 1.0 Part 1 §1.5 descriptors, Part 2 §2.7.5/§2.7.6 "<descriptor
name=... code=...>") and must be handled as the usual encoding is, not crash the connection."""

from __future__ import annotations

import struct

import pytest
from trio.testing import MockClock

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, Disposition, Transfer
from minibroker.amqp.framing import AMQP_FRAME, FRAME_HEADER
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker.test_transactions_frames import body, client

pytestmark = pytest.mark.timeout(30)

NAMES = {0x14: b"amqp:transfer:list", 0x15: b"amqp:disposition:list"}
DESCRIPTORS = {
    "ulong": lambda code: b"\x00\x80" + struct.pack(">Q", code),
    "symbol": lambda code: b"\x00\xa3" + bytes((len(NAMES[code]),)) + NAMES[code],
}


def reframed(performative: object, code: int, form: str, payload: bytes = b"") -> bytes:
    """A frame on channel 0 carrying ``performative`` with its descriptor in ``form``."""
    encoded = codec.encode(performative)
    assert encoded[:3] == b"\x00\x53" + bytes((code,))
    body_ = DESCRIPTORS[form](code) + encoded[3:] + payload
    return FRAME_HEADER.pack(8 + len(body_), 2, AMQP_FRAME, 0) + body_


@pytest.mark.parametrize("form", list(DESCRIPTORS))
async def test_transfer_and_disposition_with_other_descriptor_forms(
    mb: MemoryBroker, autojump_clock: MockClock, form: str
) -> None:
    c = await client(mb)
    await c.sender("q", 1)
    message = frames.message("hello")
    transfer = Transfer(handle=1, delivery_id=0, delivery_tag=b"t0", message_format=0, settled=False)
    await c.peer.send_raw(reframed(transfer, 0x14, form, message))
    c.next_id()
    got = await c.peer.expect(Disposition)
    assert got.first == 0
    assert isinstance(got.state, Accepted)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    frame = await c.peer.expect_frame(Transfer)
    assert body(frame.payload) == "hello"
    answer = Disposition(role=True, first=frame.performative.delivery_id, settled=True, state=Accepted())
    await c.peer.send_raw(reframed(answer, 0x15, form))
    await c.peer.expect_nothing(0.5)
    assert mb.queue("q").depth == 0
