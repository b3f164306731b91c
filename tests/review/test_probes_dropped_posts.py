"""Probes: transactional posts the engine drops without telling the core; their transaction still commits.

Part 4 §4.4.4 ("Delivery Sent Settled By Controller"): "Should the resource be unable to process the delivery
it MUST NOT allow the successful discharge of the associated transaction."
§4.4.1: "On receiving a non-settled delivery associated with a live transaction, the transactional resource
must inform the controller of the presumptive terminal outcome before it can successfully discharge the
transaction."
README "Posting" (R1): "a node deleted before the commit ... makes the commit fail with
amqp:transaction:rollback, and then nothing of the transaction is visible anywhere".

The engine discards a transfer that arrives on a link it has detached (§2.6.2: "sent before the peer saw our
detach"), on a link the transfer itself gets detached (max-message-size, no credit), and the core never
hears of it: the coordinator only ever checks *staged* posts. A transaction whose post was discarded so
commits with that post missing (a partial commit), and an unsettled post is never given any outcome.
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Detach,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import UInt
from minibroker.engine.connection import ServerConnection
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, memory_broker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import BIG, discharge_all, post_ok, watcher
from tests.broker.test_transactions_frames import client, condition
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


@pytest.mark.parametrize("settled", [True, False], ids=["presettled-post", "unsettled-post"])
async def test_post_racing_the_deletion_of_its_dynamic_node_is_dropped_and_the_commit_succeeds(
    mb: MemoryBroker, autojump_clock: MockClock, settled: bool
) -> None:
    """The dynamic node's owner (another connection) detaches while the controller's post to it is in
    flight: the broker detaches the producer link, discards the post that follows, and commits T with its
    other post applied."""
    plain_watcher = await watcher(mb, "plain")
    owner = await client(mb, "owner")
    attach = await owner.peer.attach_receiver(None, 2, source=Source(dynamic=True))
    address = attach.source.address
    c = await client(mb, "poster")
    await c.coordinator()
    txn = await c.declare()
    await c.sender("plain", 4)
    await post_ok(c, 4, "plain under T", txn)
    await c.sender(address, 3)
    # the owner goes: the node is deleted and the broker detaches our producer link (we have not read it yet)
    await owner.peer.send(Detach(handle=UInt(2), closed=True))
    await owner.peer.expect(Detach)
    await mb.settle()
    assert not mb.queue(address).exists
    await c.post(3, frames.message("to the deleted node"), txn=txn, settled=settled)
    state, others = await discharge_all(c, txn)
    assert any(isinstance(f.performative, Detach) for f in others)  # the producer link's detach
    assert isinstance(state, Rejected), (
        f"T committed without its post to the deleted node (its post to 'plain' was applied: "
        f"{mb.queue('plain').stats().enqueued_total} enqueued); frames: {others}"
    )
    assert condition(state) == Condition.TRANSACTION_ROLLBACK
    await plain_watcher.peer.expect_nothing()


def _small_messages(conn_id: int) -> ServerConnection:
    return ServerConnection(offered_capabilities=["ANONYMOUS-RELAY"], max_message_size=1000)


@pytest.mark.parametrize("settled", [True, False], ids=["presettled-post", "unsettled-post"])
# (a post without credit cannot happen any more: frames are handled in order, and the broker tops the credit up
# before the next frame of the same write is read)
@pytest.mark.parametrize("cause", ["max-message-size"])
async def test_post_discarded_by_a_link_error_does_not_fail_its_transaction(
    autojump_clock: MockClock, settled: bool, cause: str
) -> None:
    async with memory_broker(frame_tests.BrokerSettings(link_credit=3), make_engine=_small_messages) as mb:
        w = await watcher(mb, "plain")
        c = await client(mb, "poster")
        await c.coordinator()
        txn = await c.declare()
        await c.sender("plain", 4)
        await post_ok(c, 4, "plain under T", txn)
        await c.sender("other", 5)
        state = TransactionalState(txn_id=txn)
        delivery_id = c.next_id()
        await c.peer.transfer(5, delivery_id, BIG[:900], state=state, settled=settled or None, more=True)
        await c.peer.transfer(5, None, BIG[900:], settled=settled or None)
        got = await gather(c.peer)
        assert any(isinstance(f.performative, Detach) for f in got), got  # the link error
        answer, _others = await discharge_all(c, txn)
        assert isinstance(answer, Rejected), (
            f"T committed although a post in it was discarded ({cause}); 'plain' got "
            f"{mb.queue('plain').stats().enqueued_total}, 'other' got {mb.queue('other').stats().enqueued_total}"
        )
        await w.peer.expect_nothing()
