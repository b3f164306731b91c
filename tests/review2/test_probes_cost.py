"""Probe: cost that grows with other connections' rollbacks (issue 11, deviation 9's kind).

A rollback whose acquired delivery is held back by the consumer's session window is answered only once the
aborted transfer has gone out (``Coordinator.answer_waiting``). ``Broker.handle`` walked that list on every
batch of every connection, so one client that keeps its consumer's window shut and rolls back
transaction after transaction makes every other client's every read cost more: up to 64 held-back deliveries
per session (``_PENDING_LIMIT``), 256 sessions per connection, each with its waiting answer.

README "Scope and endings": "Declaring costs the same however many transactions other connections hold;
closing a connection costs in proportion to its own"; issue 11 (9): "Cost that grows with other people's
transactions".
"""

from __future__ import annotations

from functools import partial

from minibroker.amqp.definitions import Declared
from minibroker.broker.core import Broker, BrokerSettings
from tests.broker.test_transactions_adversarial import _count_lines
from tests.broker.txn_driver import TXN_ID, World, payload


def _world(rollbacks: int) -> tuple[World, object]:
    """A bystander with a producer, and an attacker whose consumer window is shut, after ``rollbacks``
    transactions that each acquired the one message of ``bait`` and rolled back."""
    world = World(Broker(BrokerSettings()))
    bystander = world.connect("bystander")
    bystander.attach_producer("p", "elsewhere")
    bystander.attach_producer("b", "bait")
    world.settle()
    bystander.transfer("b", payload("bait"))
    world.settle()
    attacker = world.connect("attacker", window=0)
    attacker.attach_controller("c")
    attacker.attach_consumer("bait", "bait", presettled=False, default_outcome=None)
    world.settle()
    for i in range(rollbacks):
        delivery_id = attacker.declare("c")
        (state, _) = world.settle()[attacker].answers[delivery_id]
        assert isinstance(state, Declared)
        attacker.flow("bait", i + 1, properties={TXN_ID: state.txn_id})  # one more credit, under T
        world.settle()
        discharge_id = attacker.discharge("c", state.txn_id, fail=True)
        assert discharge_id not in world.settle()[attacker].answers  # its answer waits behind the shut window
    return world, bystander


def test_other_connections_waiting_rollbacks_cost_every_read() -> None:
    counts = {}
    for rollbacks in (2, 60):
        world, bystander = _world(rollbacks)
        counts[rollbacks] = _count_lines(partial(bystander.transfer, "p", payload("plain")))  # type: ignore[attr-defined]
        world.settle()
    few, many = counts[2], counts[60]
    assert many <= few + max(50, few // 5), (
        f"a plain post on an unrelated connection ran {few} lines with 2 rollbacks waiting elsewhere, {many} with 60"
    )
