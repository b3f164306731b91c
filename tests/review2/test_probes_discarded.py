"""Probes: transfers the engine discards before they are whole (``TransferDiscarded``).

The fix of the first review tops up a *producer* link's credit after an aborted transfer
(``Endpoints.transfer_discarded``: "the credit it used is made good"), but only for producers: the credit of
a coordinator link is topped up only when a declare or discharge is *received* (``Coordinator.control``), so a
controller whose control transfers are aborted runs out of credit and never gets more. A client that waits for
credit, as §2.6.7 requires, can then never discharge its open transactions (they end only when it gives up
and detaches the link, which rolls them back).

Part 2 §2.6.14 / transfer.aborted: "An aborted message is implicitly settled" (it is legal on any link);
Part 2 §2.6.7: the sender may send only with credit; Part 4 §4.3: the coordinator "MUST always be able to
complete a discharge where the fail flag is set to true".
"""

from __future__ import annotations

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, AmqpValue, Declare, Detach, Flow
from minibroker.amqp.types import UInt
from minibroker.broker.coordinator import CONTROLLER_CREDIT
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import COORD, client
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


async def test_aborted_control_transfers_use_up_controller_credit_for_ever(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    _, flow = await c.coordinator()
    assert flow.link_credit == CONTROLLER_CREDIT
    txn = await c.declare()  # an open transaction the controller will want to discharge
    declare = frames.message(AmqpValue(Declare()))
    for _ in range(CONTROLLER_CREDIT - 1):  # the declare above used one
        await c.peer.transfer(COORD, c.next_id(), declare[:4], more=True)
        await c.peer.transfer(COORD, None, b"", aborted=True)
    got = await gather(c.peer)
    flows = [
        f.performative for f in got if isinstance(f.performative, Flow) and f.performative.handle == c.handles[COORD]
    ]
    credited = bool(flows and flows[-1].link_credit)
    if not credited:  # (cleanup: all the client can do is detach, which rolls its transaction back)
        await c.peer.send(Detach(handle=UInt(COORD), closed=True))
        await gather(c.peer)
    assert credited, (
        f"the controller has no credit left and none was granted after its aborted transfers; it cannot discharge "
        f"{txn!r} any more: {[f.performative for f in got]}"
    )
    assert await c.discharge(txn, fail=True) == Accepted()
