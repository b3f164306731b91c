"""Links the broker detaches several at a time (a deleted node's producers, the consumers a transaction stopped)
are detached in the order they attached, not in the order of their addresses in memory: the same client steps give
the same detach frames in the same order on every run."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.types import Symbol
from minibroker.broker.core import Broker
from minibroker.broker.policy import NodePolicy
from minibroker.broker.settings import BrokerSettings
from minibroker.engine.events import LinkDetached, LinkFlow
from minibroker.testing import frames
from tests.broker.txn_driver import World, payload

LINKS = [f"l-{n}" for n in range(6)]  # attached in this order
ROUNDS = 12  # (a memory address order would differ from one round to another)


def _world() -> tuple[World, Any]:
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy()})))
    peer = world.connect("app")
    return world, peer


def _acquiring(world: World, peer: Any, credit: int) -> bytes:
    """A controller, and every link of ``LINKS`` a consumer of "q" given ``credit`` to acquire under a transaction
    (§4.4.3: its txn-id in the flow's properties); the txn-id."""
    peer.attach_controller("ctl")
    for name in LINKS:
        peer.attach_consumer(name, "q", presettled=False, default_outcome=None)
    world.settle()
    txn_id = peer.declared("ctl")
    for name in LINKS:
        peer.flow(name, credit, properties={Symbol("txn-id"): txn_id})
    world.settle()
    return txn_id


def _producers_detached() -> list[str]:
    world, peer = _world()
    for name in LINKS:
        peer.attach_producer(name, "q")
    world.settle()
    assert world.broker.delete_node(world.broker.default, "q")
    return [name for name, _ in world.settle()[peer].detached]


def _stopped_consumers_detached() -> list[str]:
    """Each consumer acquires under a transaction whose controller goes without a discharge: they stop (§4.4.3),
    then their queue is deleted."""
    world, peer = _world()
    _acquiring(world, peer, credit=10)
    peer.detach("ctl")
    world.settle()
    assert world.broker.delete_node(world.broker.default, "q")
    return [name for name, _ in world.settle()[peer].detached]


def test_a_deleted_node_detaches_its_producers_in_the_order_they_attached() -> None:
    for _ in range(ROUNDS):
        assert _producers_detached() == LINKS


def test_a_deleted_queue_detaches_its_stopped_consumers_in_the_order_they_attached() -> None:
    for _ in range(ROUNDS):
        assert _stopped_consumers_detached() == LINKS


def _restarted_order() -> list[str]:
    """Each consumer (one credit each) acquires under a transaction that times out: they stop (§4.4.3); messages
    wait on the queue; the discharge of the timed-out id starts them again, each taking one as it starts."""
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy()}, transaction_timeout=5.0)))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    txn_id = _acquiring(world, peer, credit=1)
    world.advance(10.0)
    world.settle()
    for n in range(len(LINKS)):
        peer.transfer("p", frames.message(f"m{n}"))
    assert not world.settle()[peer].completed  # (stopped: nothing goes out)
    peer.discharge("ctl", txn_id, fail=True)
    return [completed.link for completed in world.settle()[peer].completed]


def test_consumers_stopped_on_a_timed_out_transaction_start_again_in_the_order_they_attached() -> None:
    for _ in range(ROUNDS):
        assert _restarted_order() == LINKS


def _lost_links_order() -> list[str]:
    """A connection's step fails (a broker bug) and so does the handling of its links' detaches: the broker
    detaches them itself (``Broker.fail``), each putting its message back on the queue at once, where another
    connection's consumer takes it."""
    world, peer = _world()
    peer.attach_producer("p", "q")
    for name in LINKS:
        peer.attach_consumer(name, "q", presettled=False, default_outcome=None)
        peer.flow(name, 1)
    world.settle()
    for name in LINKS:
        peer.transfer("p", payload(name))
    assert [completed.link for completed in world.settle()[peer].completed] == LINKS
    other = world.connect("other")
    other.attach_consumer("c", "q", presettled=False, default_outcome=None)
    other.flow("c", 10)
    world.settle()

    def boom(conn: Any, event: Any) -> None:
        raise RuntimeError("a broker bug")

    broker = world.broker
    broker._handlers[LinkDetached] = boom  # (the others' links never detach here)
    broker._handlers[LinkFlow] = boom
    peer.flow(LINKS[0], 2)
    seen = world.settle()[other].completed
    return [completed.name or "" for completed in seen]


def test_links_a_failed_connection_lost_are_detached_in_the_order_they_attached() -> None:
    for _ in range(ROUNDS):
        assert _lost_links_order() == LINKS
