"""Broker-wide bounds (issue 12, items 5 and 15): staged bytes of all transactions together, nodes, links,
subscriptions per topic and per connection, and idle nodes created on demand.

Each limit is set small in a real broker's ``[broker]`` configuration and probed over TCP with
``ScriptedPeer``: one more is answered with ``amqp:resource-limit-exceeded`` (an attach refused: a null
terminus, then a detach carrying the error; a post rejected; a commit failed), what is within the limit keeps
working, and making room makes it work again. The idle-node expiry is also proven in virtual time over
memory streams under ``MockClock``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Coordinator,
    Declare,
    Detach,
    Discharge,
    Disposition,
    Flow,
    Properties,
    Rejected,
    Source,
    Target,
    TransactionalState,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.server.test_limits import Controller

HOST = "127.0.0.1"
LIMIT_EXCEEDED = Condition.RESOURCE_LIMIT_EXCEEDED
ACCEPTED_LIST = Symbol("amqp:accepted:list")
REJECTED_LIST = Symbol("amqp:rejected:list")


@pytest.fixture
def limited(request: pytest.FixtureRequest) -> Iterator[ThreadedBroker]:
    """A broker configured with the ``[broker]`` keys given by ``@limits``."""
    with run_in_thread({"server": {"port": 0}, "broker": request.param}) as running:
        yield running


def limits(**broker: Any) -> Any:
    return pytest.mark.parametrize("limited", [broker], indirect=True, ids=[""])


def condition(performative: Any) -> str | None:
    return None if performative.error is None else str(performative.error.condition)


def opened(broker: ThreadedBroker) -> ScriptedPeer:
    peer = ScriptedPeer.connect(HOST, broker.port)
    peer.open()
    peer.begin()
    return peer


def refused(peer: ScriptedPeer, attach: Attach) -> str | None:
    """The condition an attach was refused with (a null terminus, then a detach with the error)."""
    assert attach.source is None or attach.target is None, f"not refused: {attach!r}"
    detach = peer.expect(Detach)
    peer.send(Detach(handle=attach.handle, closed=True))
    return condition(detach)


def sized(size: int) -> bytes:
    """An encoded message of exactly ``size`` bytes."""
    overhead = len(frames.message("x" * 300)) - 300
    return frames.message("x" * (size - overhead))


# -- staged bytes of every transaction together ------------------------------------------------------------
@limits(max_total_staged_bytes=1000)
def test_max_total_staged_bytes(limited: ThreadedBroker) -> None:
    with opened(limited) as first, opened(limited) as second:
        a, b = Controller(first), Controller(second)
        for peer in (first, second):
            peer.attach_sender("staged", handle=1)
            peer.expect(Flow)
        txn_a, txn_b = a.declare(), b.declare()
        assert isinstance(a.post(1, txn_a, sized(600)), Accepted)
        # another connection's transaction: 1200 bytes staged on the broker would be too many
        outcome = b.post(1, txn_b, sized(600))
        assert isinstance(outcome, Rejected)
        assert condition(outcome) == LIMIT_EXCEEDED
        failed = b.commit(txn_b)
        assert isinstance(failed, Rejected)
        assert condition(failed) == Condition.TRANSACTION_ROLLBACK
        assert limited.queue("staged").depth == 0
        # the first commits; what it staged is no longer counted, so the second can post again
        assert isinstance(a.commit(txn_a), Accepted)
        txn_b = b.declare()
        assert isinstance(b.post(1, txn_b, sized(900)), Accepted)
        # a rollback frees what was staged too
        assert isinstance(b.control(Discharge(txn_id=txn_b, fail=True)), Accepted)
        txn_a = a.declare()
        assert isinstance(a.post(1, txn_a, sized(900)), Accepted)
        assert isinstance(a.commit(txn_a), Accepted)
        first.close()
        second.close()
    assert limited.queue("staged").depth == 2


# -- nodes -----------------------------------------------------------------------------------------------------
@limits(max_nodes=3)
def test_max_nodes(limited: ThreadedBroker) -> None:
    with opened(limited) as peer:
        for handle, address in enumerate(["n1", "n2", "n3"]):
            assert peer.attach_sender(address, handle=handle).target is not None
            peer.expect(Flow)
        # a fourth node: refused, for a sender, a receiver and a dynamic node alike
        assert refused(peer, peer.attach_sender("n4", handle=3)) == LIMIT_EXCEEDED
        assert refused(peer, peer.attach_receiver("n4", handle=3)) == LIMIT_EXCEEDED
        dynamic = peer.attach_receiver(None, handle=3, name="dyn", source=Source(dynamic=True))
        assert refused(peer, dynamic) == LIMIT_EXCEEDED
        assert not limited.queue("n4").exists
        # an existing node is attached as before
        assert peer.attach_receiver("n1", handle=3, name="reader").source is not None
        # the anonymous relay: a post to an address with no node is rejected, to one with a node accepted
        peer.attach_sender(None, handle=4, name="relay", target=Target())
        peer.expect(Flow)
        peer.transfer(4, 0, frames.message("to n5", Properties(to="n5")))
        outcome = peer.expect(Disposition).state
        assert isinstance(outcome, Rejected)
        assert condition(outcome) == LIMIT_EXCEEDED
        peer.transfer(4, 1, frames.message("to n2", Properties(to="n2")))
        assert isinstance(peer.expect(Disposition).state, Accepted)
        # a dead-letter address is created regardless: a rejected message is never lost to the limit
        peer.transfer(0, 2, frames.message("bad"))
        assert isinstance(peer.expect(Disposition).state, Accepted)
        peer.flow(handle=3, link_credit=1, delivery_count=0)
        transfer = peer.expect(frames.Transfer)
        peer.disposition(transfer.delivery_id or 0, state=Rejected())
        limited.wait_for(lambda: limited.queue("n1.DLQ").depth == 1)
        peer.close()


@limits(max_nodes=2)
def test_max_nodes_fails_a_commit_that_would_create_one(limited: ThreadedBroker) -> None:
    with opened(limited) as peer:
        txn = Controller(peer)
        peer.attach_sender("n1", handle=1)
        peer.expect(Flow)
        peer.attach_sender(None, handle=2, name="relay", target=Target())
        peer.expect(Flow)
        txn_id = txn.declare()
        # created by the commit: the first fits, the second would pass the limit
        assert isinstance(txn.post(2, txn_id, frames.message("a", Properties(to="new-a"))), Accepted)
        assert isinstance(txn.post(2, txn_id, frames.message("b", Properties(to="new-b"))), Accepted)
        failed = txn.commit(txn_id)
        assert isinstance(failed, Rejected)
        assert condition(failed) == Condition.TRANSACTION_ROLLBACK
        assert failed.error is not None
        assert "at most 2 nodes" in str(failed.error.description)
        assert not limited.queue("new-a").exists
        # at the limit already: the post itself is rejected
        peer.attach_sender("n2", handle=3)
        peer.expect(Flow)
        txn_id = txn.declare()
        outcome = txn.post(2, txn_id, frames.message("c", Properties(to="new-c")))
        assert isinstance(outcome, Rejected)
        assert condition(outcome) == LIMIT_EXCEEDED
        assert isinstance(txn.commit(txn_id), Rejected)
        peer.close()


# -- links -----------------------------------------------------------------------------------------------------
@limits(max_links=3)
def test_max_links(limited: ThreadedBroker) -> None:
    with opened(limited) as first, opened(limited) as second:
        first.attach_sender("q", handle=0)
        first.expect(Flow)
        first.attach_receiver("q", handle=1)
        second.attach_sender("q", handle=0)
        second.expect(Flow)
        # the fourth link on the broker, whichever connection asks
        assert refused(second, second.attach_receiver("q", handle=1)) == LIMIT_EXCEEDED
        assert refused(first, first.attach_sender("other", handle=2)) == LIMIT_EXCEEDED
        # detaching one makes room
        first.send(Detach(handle=UInt(1), closed=True))
        first.expect(Detach)
        assert second.attach_receiver("q", handle=1, name="again").source is not None
        # a closed connection gives its links back
        first.close()
        assert second.attach_receiver("q", handle=2, name="third").source is not None
        second.close()


# -- subscriptions ---------------------------------------------------------------------------------------------
@limits(max_subscriptions_per_topic=2)
def test_max_subscriptions_per_topic(limited: ThreadedBroker) -> None:
    durable = Source(address="topic://news", durable=UInt(2), expiry_policy=Symbol("never"))
    with opened(limited) as first, opened(limited) as second:
        first.attach_receiver("topic://news", handle=0, name="a")
        # a durable subscription keeps counting while detached
        first.attach_receiver("topic://news", handle=1, name="kept", source=durable)
        first.send(Detach(handle=UInt(1), closed=False))
        first.expect(Detach)
        assert refused(second, second.attach_receiver("topic://news", handle=0, name="b")) == LIMIT_EXCEEDED
        # resuming the durable one is no new subscription
        resumed = second.attach_receiver("topic://news", handle=0, name="kept", source=durable)
        assert resumed.source is not None
        # another topic is not affected
        assert second.attach_receiver("topic://weather", handle=1, name="w").source is not None
        # an unsubscribe makes room
        second.send(Detach(handle=UInt(0), closed=True))
        second.expect(Detach)
        assert second.attach_receiver("topic://news", handle=0, name="b").source is not None
        first.close()
        second.close()


@limits(max_subscriptions_per_topic=1)
def test_joining_a_shared_subscription_is_not_a_new_one(limited: ThreadedBroker) -> None:
    shared = Source(address="topic://jobs", capabilities=[Symbol("shared"), Symbol("global")])
    with opened(limited) as first, opened(limited) as second:
        assert first.attach_receiver("topic://jobs", handle=0, name="workers", source=shared).source is not None
        assert second.attach_receiver("topic://jobs", handle=0, name="workers", source=shared).source is not None
        assert refused(second, second.attach_receiver("topic://jobs", handle=1, name="other")) == LIMIT_EXCEEDED
        first.close()
        second.close()


@limits(max_subscriptions_per_connection=2)
def test_max_subscriptions_per_connection(limited: ThreadedBroker) -> None:
    with opened(limited) as first, opened(limited) as second:
        first.attach_receiver("topic://a", handle=0, name="a")
        first.attach_receiver("topic://b", handle=1, name="b")
        assert refused(first, first.attach_receiver("topic://c", handle=2, name="c")) == LIMIT_EXCEEDED
        # queues are not subscriptions, and another connection has its own count
        assert first.attach_receiver("q", handle=2, name="q").source is not None
        assert second.attach_receiver("topic://c", handle=0, name="c").source is not None
        first.send(Detach(handle=UInt(0), closed=True))
        first.expect(Detach)
        assert first.attach_receiver("topic://c", handle=0, name="c2").source is not None
        first.close()
        second.close()


# -- idle nodes created on demand ------------------------------------------------------------------------------
@limits(auto_delete_idle=0.3)
def test_idle_auto_created_queue_is_deleted(limited: ThreadedBroker) -> None:
    with opened(limited) as peer:
        peer.attach_sender("passing", handle=0)
        peer.expect(Flow)
        peer.send(Detach(handle=UInt(0), closed=True))
        peer.expect(Detach)
        assert limited.queue("passing").exists
        limited.wait_for(lambda: not limited.queue("passing").exists, timeout=3)
        peer.close()


IDLE = 10.0


@pytest.fixture
async def mb() -> Any:
    settings = BrokerSettings(auto_delete_idle=IDLE, queues={"configured": BrokerSettings().node_defaults})
    async with memory_broker(settings, receive_timeout=5.0) as running:
        yield running


async def peer_of(mb: MemoryBroker) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open()
    await peer.begin()
    return peer


async def test_idle_expiry_spares_what_is_in_use(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await peer_of(mb)
    for handle, address in enumerate(["idle", "holding", "linked", "configured"]):
        await peer.attach_sender(address, handle, name=f"s-{address}")
        await peer.expect(Flow)
    await peer.transfer(1, 0, frames.message("kept"))
    await peer.expect(Disposition)
    for handle in (0, 1, 3):
        await peer.send(Detach(handle=UInt(handle), closed=True))
        await peer.expect(Detach)
    await trio.sleep(IDLE * 0.9)
    assert mb.queue("idle").exists  # not idle long enough yet
    await trio.sleep(IDLE)
    queues = mb.queues
    assert "idle" not in queues  # empty, no link: gone
    assert {"holding", "linked", "configured"} <= set(queues)
    # a queue that was used meanwhile starts counting again
    await peer.attach_receiver("holding", 4, name="r")
    await peer.flow(handle=4, link_credit=1, delivery_count=0)
    transfer = await peer.expect(frames.Transfer)
    await peer.disposition(transfer.delivery_id or 0, state=Accepted())
    await peer.send(Detach(handle=UInt(4), closed=True))
    await peer.expect(Detach)
    await trio.sleep(IDLE / 2)
    assert mb.queue("holding").exists
    await trio.sleep(IDLE * 1.6)
    assert not mb.queue("holding").exists
    assert {"linked", "configured"} <= set(mb.queues)


async def test_idle_expiry_spares_a_queue_with_staged_work(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await peer_of(mb)
    await peer.attach_sender(
        None, 0, name="txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    await peer.expect(Flow)
    await peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
    declared = (await peer.expect(Disposition)).state
    await peer.attach_sender("pending", 1, name="p")
    await peer.expect(Flow)
    await peer.transfer(1, 1, frames.message("staged"), state=TransactionalState(txn_id=declared.txn_id))
    await peer.expect(Disposition)
    await peer.send(Detach(handle=UInt(1), closed=True))
    await peer.expect(Detach)
    await trio.sleep(IDLE * 3)
    assert mb.queue("pending").staged == 1
    await peer.transfer(0, 2, frames.message(AmqpValue(Discharge(txn_id=declared.txn_id, fail=False))))
    assert isinstance((await peer.expect(Disposition)).state, Accepted)
    assert mb.queue("pending").depth == 1  # the commit found its node
    assert mb.broker.next_deadline() is not None


async def test_no_sweep_without_nodes_created_on_demand(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await peer_of(mb)
    await peer.attach_sender("configured", 0, name="s")
    await peer.expect(Flow)
    assert mb.broker.next_deadline() is None
