"""Doubtful readings, each with a probe (the report says why they are doubtful).

1. A plain (non-transactional) settled outcome for a delivery acquired outside any transaction, whose outcome
   was staged in an open transaction T before. README "Retiring": an outcome staged under one transaction for
   such a delivery "can be staged again under another: the latest holds it (§4.4.2: the delivery 'need not be
   associated with the same transaction as the outcome, or indeed with any transaction at all')". The broker
   moves the outcome between transactions, but not out of them: the plain outcome is ignored, and if T rolls
   back, the delivery (now settled by the client) gets the source's default outcome, released: the message the
   client accepted and settled outside any transaction is delivered again.
"""

from __future__ import annotations

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, TransactionalState
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import _fill, client
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


async def test_a_later_plain_outcome_takes_the_outcome_out_of_the_transaction(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)  # acquired outside any transaction
    delivery_id = delivered.performative.delivery_id
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn, outcome=Accepted()))
    await c.peer.disposition(delivery_id, settled=True, state=Accepted())  # the client's last word: consumed
    await gather(c.peer)
    assert await c.discharge(txn, fail=True) == Accepted()
    queue = mb.queue("q")
    depth = queue.depth
    queue.purge()
    assert depth == 0, "a message the client accepted and settled outside any transaction came back when T rolled back"
