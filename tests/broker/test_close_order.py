"""Connections the broker closes several at a time (a namespace reset, transaction time-outs that close their
connection) are closed in the order they came, not in the order of their addresses in memory: what one's close puts
back on a queue goes to a consumer of another still open, so the order decides which peer sees which delivery, and
when."""

from __future__ import annotations

from minibroker.amqp.types import Symbol
from minibroker.broker.core import Broker
from minibroker.broker.personality import BROKER_J
from minibroker.broker.policy import NodePolicy
from minibroker.broker.settings import BrokerSettings
from tests.broker.txn_driver import World, payload

PEERS = 6
ROUNDS = 12  # (a memory address order would differ from one round to another)


def _seen_at_reset() -> list[list[str]]:
    """Each peer's consumer holds one message unsettled and has one credit left; the reset closes them all."""
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy()})))
    peers = [world.connect(f"app-{n}") for n in range(PEERS)]
    for peer in peers:
        peer.attach_consumer("c", "q", presettled=False, default_outcome=None)
        peer.flow("c", 2)
    peers[0].attach_producer("p", "q")
    world.settle()
    for n in range(PEERS):
        peers[0].transfer("p", payload(f"m{n}"))
    seen = world.settle()
    assert [[c.name for c in seen[peer].completed] for peer in peers] == [[f"m{n}"] for n in range(PEERS)]
    world.broker.reset()
    seen = world.settle()
    return [[c.name or "" for c in seen[peer].completed] for peer in peers]


def test_a_namespace_reset_closes_its_connections_in_the_order_they_came() -> None:
    first = _seen_at_reset()
    assert first[0] == []  # the first to come is the first closed: it sees nothing more
    assert sum(len(names) for names in first) > 1  # (a close's messages went to later ones)
    for _ in range(ROUNDS):
        assert _seen_at_reset() == first


def _seen_after_time_outs() -> list[str]:
    """Each peer's consumer acquires one message under its own transaction; all time out in one timer step, and
    this personality closes the connection of a transaction that timed out: each close rolls back, and another
    peer's consumer takes what comes back."""
    settings = BrokerSettings(queues={"q": NodePolicy()}, personality=BROKER_J, transaction_timeout=5.0)
    world = World(Broker(settings))
    peers = [world.connect(f"app-{n}") for n in range(PEERS)]
    for peer in peers:
        peer.attach_controller("ctl")
        peer.attach_consumer("c", "q", presettled=False, default_outcome=None)
    publisher = world.connect("publisher")
    publisher.attach_producer("p", "q")
    world.settle()
    for peer in peers:
        txn_id = peer.declared("ctl")
        peer.flow("c", 1, properties={Symbol("txn-id"): txn_id})
    world.settle()
    for n in range(PEERS):
        publisher.transfer("p", payload(f"m{n}"))
    seen = world.settle()
    assert [[c.name for c in seen[peer].completed] for peer in peers] == [[f"m{n}"] for n in range(PEERS)]
    observer = world.connect("observer")
    observer.attach_consumer("c", "q", presettled=False, default_outcome=None)
    observer.flow("c", 10)
    world.settle()
    world.advance(10.0)
    return [c.name or "" for c in world.settle()[observer].completed]


def test_connections_closed_by_transaction_time_outs_are_closed_in_the_order_they_came() -> None:
    for _ in range(ROUNDS):
        assert _seen_after_time_outs() == [f"m{n}" for n in range(PEERS)]
