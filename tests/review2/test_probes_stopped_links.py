"""Probes: links stopped because the transaction they acquired under ended without a discharge
(``Coordinator._stopped``; README "Time-out").

A stopped link is taken out of its queue's consumer group (``Dispatcher.stop``). Everything that finds a
queue's links through that group then misses it: deleting the node (``Dispatcher.queue_deleted``) detaches
only the links in the group, so a stopped link stays attached to a node that no longer exists, is never told,
and is put back to "acquiring" from a deleted queue by the flow or discharge that restarts it.

README "Scope and endings"/endpoints: "deleting a node detaches every link still attached to it with
`amqp:resource-deleted`"; README "Time-out": the stopped link waits only "until a flow names an open
transaction, a flow with properties ends transactional acquisition, or the controller discharges the
timed-out id". Part 2 §2.6.? / Part 3 §3.5.3: a dynamic node "will be destroyed" with its link; the
links to it cannot go on.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Detach, Target, Transfer
from minibroker.amqp.types import UInt
from minibroker.broker.core import BrokerSettings
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import COORD, TXN_ID, client, condition
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
@pytest.mark.parametrize("ending", ["time-out", "controller-detached"])
async def test_deleting_a_node_detaches_a_link_stopped_on_an_ended_transaction(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    """A producer link with a dynamic target makes a node; a consumer of that node acquires under T; T ends
    without a discharge (time-out, or its controller detaches) and the consumer stops. The producer detaches,
    deleting the node: every link attached to it must be detached with amqp:resource-deleted. The stopped
    consumer is not: it is no longer in the group the deletion walks."""
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    attach = await c.peer.attach_sender(None, 1, target=Target(dynamic=True))
    await gather(c.peer)  # its credit
    address = attach.target.address
    assert address
    await c.receiver(address, 2)
    await c.credit(2, 5, properties={TXN_ID: txn})
    if ending == "time-out":
        await trio.sleep(11)
    else:
        await c.peer.send(Detach(handle=UInt(COORD), closed=True))
    await gather(c.peer)
    await c.peer.send(Detach(handle=UInt(1), closed=True))  # the dynamic node goes with its link
    got = await gather(c.peer)
    detaches = {f.performative.handle: f.performative for f in got if isinstance(f.performative, Detach)}
    consumer = c.handles[2]
    assert consumer in detaches, (
        f"the node was deleted, yet its (stopped) consumer link was not detached: {[f.performative for f in got]}"
    )
    assert condition(detaches[consumer]) == "amqp:resource-deleted"


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_a_consumer_restarted_after_its_node_was_deleted_is_not_left_on_the_deleted_queue(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The same stopped consumer, restarted by the discharge of the timed-out id (README: the discharge lets
    the link "go on"), now consumes from a queue object that has been deleted: a message posted to the same
    address (re-created by auto-create) never reaches it, and it is never told why. A consumer that is not
    stopped at the deletion is detached with amqp:resource-deleted instead."""
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    attach = await c.peer.attach_sender(None, 1, target=Target(dynamic=True))
    await gather(c.peer)
    address = attach.target.address
    await c.receiver(address, 2)
    await c.credit(2, 5, properties={TXN_ID: txn})
    await trio.sleep(11)  # T times out: the consumer stops
    await c.peer.send(Detach(handle=UInt(1), closed=True))  # the node is deleted
    got = await gather(c.peer)  # (the stopped consumer is detached here, resource-deleted)
    assert await c.discharge(txn, fail=True) == Accepted()  # the consumer goes on
    # the address cannot be made again by auto-create (README: nobody makes a node under `dynamic.`)
    await c.peer.attach_sender(address, 3)
    refused = await gather(c.peer)
    assert any(isinstance(f.performative, Detach) and condition(f.performative) == "amqp:not-found" for f in refused), [
        f.performative for f in refused
    ]
    got += refused
    consumer = c.handles[2]
    told = any(isinstance(f.performative, Detach) and f.performative.handle == consumer for f in got)
    delivered = any(isinstance(f.performative, Transfer) and f.performative.handle == consumer for f in got)
    assert told or delivered, (
        f"a consumer link is still attached to {address!r}, neither detached nor served: "
        f"{[f.performative for f in got]}"
    )
