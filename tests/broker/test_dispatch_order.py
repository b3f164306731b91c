"""Queues served in one dispatch (a commit's, a rollback's, a batch of outcomes') are served in the order they were
made, not in the order of their addresses in memory: the same client steps give the same deliveries in the same
order on every run (a test broker that deals them out differently from run to run makes flaky tests)."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.broker.core import Broker
from minibroker.broker.policy import NodePolicy
from minibroker.broker.settings import BrokerSettings
from minibroker.testing import frames
from tests.broker.txn_driver import World

SUBSCRIBERS = [f"c-{n}" for n in range(6)]  # each its own subscription of the topic, made in this order


def _world() -> tuple[World, Any, bytes]:
    world = World(Broker(BrokerSettings(topics={"t": NodePolicy()})))
    peer = world.connect("app")
    peer.attach_producer("p", "t")
    peer.attach_controller("ctl")
    for name in SUBSCRIBERS:
        peer.attach_consumer(name, "t", presettled=False, default_outcome=None)
    world.settle()
    txn_id = peer.declared("ctl")
    for name in SUBSCRIBERS:
        peer.flow(name, 10)
    world.settle()
    return world, peer, txn_id


def _committed_order() -> list[str]:
    world, peer, txn = _world()
    peer.transfer("p", frames.message("m"), state=TransactionalState(txn_id=txn))
    world.settle()
    peer.discharge("ctl", txn, fail=False)
    return [completed.link for completed in world.settle()[peer].completed]


def _rolled_back_order() -> list[str]:
    """Each subscriber acquires its copy in a transaction (§4.4.3: txn-id in the flow's properties); the rollback
    puts them all back at once, and each goes out again."""
    world, peer, txn = _world()
    for name in SUBSCRIBERS:
        peer.flow(name, 10, properties={Symbol("txn-id"): txn})
    world.settle()
    peer.transfer("p", frames.message("m"))
    assert [c.link for c in world.settle()[peer].completed] == SUBSCRIBERS
    peer.discharge("ctl", txn, fail=True)
    return [completed.link for completed in world.settle()[peer].completed]


@pytest.mark.parametrize("order", [_committed_order, _rolled_back_order])
def test_a_discharge_serves_the_queues_it_touched_in_the_order_they_were_made(order: Any) -> None:
    for _ in range(12):  # (a memory address order would differ from one run to another)
        assert order() == SUBSCRIBERS
