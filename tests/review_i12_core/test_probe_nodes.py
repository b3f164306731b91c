"""Probes: max_nodes against commits that create nodes, and auto_delete_idle against work in progress
(issue 12, item 15)."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Declared, MessageAnnotations, Properties, Rejected, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.handles import CoreView
from minibroker.testing import frames
from tests.broker.txn_driver import World, payload


def _declare(world: World, peer: Any) -> bytes:
    delivery_id = peer.declare("c")
    state, _ = world.settle()[peer].answers[delivery_id]
    assert isinstance(state, Declared)
    return bytes(state.txn_id)


def test_a_commit_that_would_pass_max_nodes_fails_and_shows_nothing() -> None:
    world = World(Broker(BrokerSettings(max_nodes=3, auto_delete_idle=0)))
    view = CoreView(world.broker)
    peer = world.connect("app")
    peer.attach_controller("c")
    peer.attach_producer("q", "q")  # node 1
    peer.attach_producer("relay", None)
    world.settle()
    txn = _declare(world, peer)
    ids = [
        peer.transfer("q", payload("to-q"), state=TransactionalState(txn_id=txn)),
        peer.transfer("relay", payload("to-a", to="a"), state=TransactionalState(txn_id=txn)),
        peer.transfer("relay", payload("to-b", to="b"), state=TransactionalState(txn_id=txn)),
        peer.transfer("relay", payload("to-a2", to="queue://a"), state=TransactionalState(txn_id=txn)),
    ]
    answers = world.settle()[peer].answers
    assert all(isinstance(answers[i][0].outcome, Accepted) for i in ids), (
        answers
    )  # at post time each deferred node fits
    other = world.connect("other")
    other.attach_producer("x", "x")  # node 2: now a and b cannot both be made
    world.settle()
    assert len(view.queues) == 2
    discharge = peer.discharge("c", txn, fail=False)
    state, _ = world.settle()[peer].answers[discharge]
    assert isinstance(state, Rejected), state
    assert view.queues == ["q", "x"], view.queues
    assert view.queue("q").depth == 0
    assert world.broker.coordinator.staged_bytes == 0
    assert view.queue("q").staged == 0


def test_idle_sweep_spares_a_node_with_a_scheduled_message_or_a_staged_post() -> None:
    world = World(Broker(BrokerSettings(auto_delete_idle=10)))
    view = CoreView(world.broker)
    peer = world.connect("app")
    peer.attach_controller("c")
    peer.attach_producer("relay", None)
    world.settle()
    txn = _declare(world, peer)
    # "sched": a message due in 60 s; "staged": a relay post staged in an open transaction; both via the relay,
    # so no link holds either node
    later = MessageAnnotations({Symbol("x-opt-delivery-delay"): 60_000})
    peer.transfer("relay", frames.message("<<s>>", later, Properties(to="sched")), settled=True)
    peer.transfer("relay", payload("first", to="staged"), settled=True)  # creates it
    world.settle()
    consumer = world.connect("consumer")
    consumer.attach_consumer("in", "staged", presettled=True, default_outcome=None)
    consumer.flow("in", 1)
    world.settle()
    consumer.detach("in")
    world.settle()
    peer.transfer("relay", payload("staged", to="staged"), state=TransactionalState(txn_id=txn))
    world.settle()
    for _ in range(8):
        world.advance(5)
        world.settle()
    assert view.queue("sched").exists
    assert view.queue("sched").stats().scheduled == 1
    assert view.queue("staged").exists
    discharge = peer.discharge("c", txn, fail=False)
    state, _ = world.settle()[peer].answers[discharge]
    assert isinstance(state, Accepted), state
    assert view.queue("staged").depth == 1
    world.advance(60)
    world.settle()
    assert view.queue("sched").depth == 1
