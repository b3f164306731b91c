"""Probe of the ready list's head operations (``_Ready.first``/``pop_first``, issue 19) under a transaction's
rollback: transactional accepts of some deliveries (Part 4 §4.4.2) rolled back leave those messages where they
were; released deliveries go back to their places; the consumer then takes them in their original order."""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Released, TransactionalState, Transfer
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker.test_transactions_frames import body, client

pytestmark = pytest.mark.timeout(60)


async def test_rolled_back_accepts_then_released_come_back_in_order(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    for i in range(12):
        await c.post(1, frames.message(i), settled=True)
    await c.receiver("q", 2)
    await c.credit(2, 12)
    first = [await c.peer.expect_frame(Transfer) for _ in range(12)]
    assert [body(f.payload) for f in first] == list(range(12))
    txn = await c.declare()
    for f in first[2:9:3]:  # 2, 5, 8
        await c.peer.disposition(
            f.performative.delivery_id, settled=False, state=TransactionalState(txn_id=txn, outcome=Accepted())
        )
    assert await c.discharge(txn, fail=True) == Accepted()
    # the rolled-back accepts left the deliveries unsettled with the consumer: release them all, in reverse
    for f in reversed(first):
        await c.peer.disposition(f.performative.delivery_id, state=Released())
    await c.credit(2, 12)
    again = [await c.peer.expect_frame(Transfer) for _ in range(12)]
    assert [body(f.payload) for f in again] == list(range(12))
    for f in again:
        await c.peer.disposition(f.performative.delivery_id, state=Accepted())
    await c.peer.expect_nothing(0.5)
    assert mb.queue("q").depth == 0
