"""Probes: a link acquiring under T keeps acquiring, outside any transaction, after T is rolled back by the
end of its control link.

Part 4 §4.1: "If the control link is closed while there exist non-discharged transactions it created, then all
such transactions are immediately rolled back, and attempts to perform further transactional work on them
will lead to failure." A consumer link whose flow named T asked for its acquisitions to be work of T.
issue 11 (deviation 5) fixed this for time-outs only (R5: "Every consumer link acquiring under T STOPS
sending"); when T ends because its controller link went (detached by the client, or by the broker on a
settled declare, a §4.4.2 conflict, an R6 partial discharge ...), ``_end`` just clears the link's txn-id and
the rollback re-dispatches the released message to the very same link, now as a plain, non-transactional
delivery, followed by everything else that arrives while credit lasts. The controller did not discharge, so
the spec's advice to drain before discharging could not be followed.
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Declare, Detach, Transfer
from minibroker.amqp.types import UInt
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import post_ok
from tests.broker.test_transactions_frames import COORD, TXN_ID, _fill, client
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


@pytest.mark.parametrize("how", ["client-detaches-controller", "broker-detaches-controller"])
async def test_no_plain_acquisition_on_a_link_bound_to_a_transaction_its_controller_took_down(
    mb: MemoryBroker, autojump_clock: MockClock, how: str
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 5, properties={TXN_ID: txn})
    await c.take(1)
    if how == "client-detaches-controller":
        await c.peer.send(Detach(handle=UInt(COORD), closed=True))
    else:
        await c.control(Declare(), settled=True)  # §4.3 / R7: the broker detaches the controller
    got = await gather(c.peer)
    producer = await client(mb, "producer")
    await producer.sender("q", 1)
    await post_ok(producer, 1, "m1")
    got += await gather(c.peer)
    plain = [f for f in got if isinstance(f.performative, Transfer) and f.performative.state is None]
    assert plain == [], (
        f"after T was rolled back by the end of its control link, the link bound to T acquired "
        f"{len(plain)} message(s) outside any transaction: {[f.performative for f in plain]}"
    )
