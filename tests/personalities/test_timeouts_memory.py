"""Time-outs are kept in a heap of deadlines, one per timed transaction (timed from its declare or, for some
personalities, from its first operation). The entries of transactions that end before their deadline must not
pile up: a broker running 2000 short transactions with a 300 s time-out keeps a bounded heap, not one entry per
transaction it ever ran."""

from __future__ import annotations

import pytest

from minibroker.amqp.definitions import TransactionalState
from tests.broker.txn_driver import payload
from tests.personalities.harness import peer, world


@pytest.mark.parametrize("name", ["minibroker", "broker-j", "servicebus"])
def test_the_deadlines_of_ended_transactions_do_not_pile_up(name: str) -> None:
    w = world(name, transaction_timeout=300)
    p = peer(w)
    p.attach_controller("ctl")
    p.attach_producer("in", "q")
    w.settle()
    for n in range(2000):
        declare = p.declare("ctl")
        txn_id = w.settle()[p].answers[declare][0].txn_id
        p.transfer("in", payload(f"m{n}"), state=TransactionalState(txn_id=txn_id))
        p.discharge("ctl", txn_id, fail=False)
        w.settle()
    assert w.broker.transactions == []
    assert w.broker.queues["q"].depth == 2000
    assert len(w.broker.coordinator._deadlines) <= 64 + 1
