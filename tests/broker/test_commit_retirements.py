"""A commit's retirements (Part 4 §4.4.2): what it settles, and that it touches only its own staged work.

Issue 19: "Group commit for in-memory transactions is free: make sure a commit touches only its own staged work
(no scans), and settles its retirements as ranges." A transaction's outcomes are staged by dispositions that carry
``transactional-state`` (proton's ``tx_recv``: one unsettled disposition per delivery); its commit applies them and
settles, as the broker, the deliveries it still holds unsettled, grouped by outcome into runs of ids.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Declared, Disposition, Released, TransactionalState
from minibroker.broker.core import Broker, BrokerSettings
from tests.broker.test_transactions_adversarial import _count_lines
from tests.broker.txn_driver import Peer, World, payload


def _receiving(messages: int) -> tuple[World, Peer, list[int]]:
    """A consumer that received ``messages`` messages of queue ``q`` unsettled, with a controller attached."""
    world = World(Broker(BrokerSettings()))
    producer = world.connect("producer")
    producer.attach_producer("p", "q")
    world.settle()
    for i in range(messages):
        producer.transfer("p", payload(f"m{i}"), settled=True)
    world.settle()
    consumer = world.connect("consumer")
    consumer.attach_controller("c")
    consumer.attach_consumer("r", "q", presettled=False, default_outcome=None)
    world.settle()
    consumer.flow("r", messages)
    seen = world.settle()[consumer]
    ids = [c.delivery_id for c in seen.completed]
    assert len(ids) == messages
    return world, consumer, ids


def _declare(world: World, consumer: Peer) -> bytes:
    delivery_id = consumer.declare("c")
    (state, _) = world.settle()[consumer].answers[delivery_id]
    assert isinstance(state, Declared)
    txn_id: bytes = state.txn_id
    return txn_id


def _stage(world: World, consumer: Peer, txn_id: bytes, ids: list[int], outcome: Any) -> None:
    for delivery_id in ids:
        consumer.dispose(delivery_id, TransactionalState(txn_id=txn_id, outcome=outcome), settled=False)
    world.settle()


def test_commit_settles_its_own_retirements_by_outcome_in_runs() -> None:
    world, consumer, ids = _receiving(12)
    mine, other = _declare(world, consumer), _declare(world, consumer)
    accepted, released, elsewhere = ids[0:6], ids[6:9], ids[9:12]
    _stage(world, consumer, mine, accepted, Accepted())
    _stage(world, consumer, mine, released, Released())
    _stage(world, consumer, other, elsewhere, Accepted())
    discharge = consumer.discharge("c", mine, fail=False)
    seen = world.settle()[consumer]
    assert isinstance(seen.answers[discharge][0], Accepted)
    settled = dict(seen.settled_by_broker)
    assert sorted(settled) == accepted + released  # the other transaction's deliveries stay as they were
    assert all(isinstance(settled[i], Accepted) for i in accepted)
    assert all(isinstance(settled[i], Released) for i in released)
    settling = [p for p in seen.performatives if isinstance(p, Disposition) and not p.role]
    # one disposition per outcome: each run of consecutive ids with one outcome is a range
    assert [(p.first, p.last if p.last is not None else p.first) for p in settling] == [(0, 5), (6, 8)]
    assert all(p.settled and not p.role for p in settling)
    # the released ones are back on the queue; the other transaction still holds its outcomes
    consumer.flow("r", 3)
    again = world.settle()[consumer]
    assert sorted(c.name or "" for c in again.completed) == ["m6", "m7", "m8"]
    discharge = consumer.discharge("c", other, fail=False)
    seen = world.settle()[consumer]
    assert sorted(dict(seen.settled_by_broker)) == elsewhere


def test_commit_cost_does_not_grow_with_another_transactions_retirements() -> None:
    counts = {}
    for staged_elsewhere in (2, 300):
        world, consumer, ids = _receiving(10 + staged_elsewhere)
        mine, other = _declare(world, consumer), _declare(world, consumer)
        _stage(world, consumer, mine, ids[:10], Accepted())
        _stage(world, consumer, other, ids[10:], Accepted())
        counts[staged_elsewhere] = _count_lines(lambda c=consumer, t=mine: c.discharge("c", t, fail=False))
        seen = world.settle()[consumer]
        assert sorted(dict(seen.settled_by_broker)) == ids[:10]
    few, many = counts[2], counts[300]
    # O(own work) stays within the slack; a scan of the other transaction's 300 outcomes adds thousands of lines
    assert many <= few + max(50, few // 5), f"a commit of 10: {few} lines beside 2 staged elsewhere, {many} beside 300"
