"""Review of issue 15: the deadline heap that replaced the "oldest first" scan of time-outs (coordinator ``_time``,
``_due``, ``handle_timeout``), under the default personality and the ones that time out differently."""

from __future__ import annotations

from minibroker.amqp.definitions import Accepted, Rejected, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.broker.personality import get
from tests.broker.txn_driver import BrokerView, census, payload
from tests.personalities.harness import answer, declare, peer, world

TIMEOUT = Symbol("amqp:transaction:timeout")


def test_default_many_transactions_time_out_each_at_its_own_time() -> None:
    """Five transactions declared 10 s apart (time-out 100 s) time out one by one at declare + 100 s, never earlier,
    and a timed-out id is answered with amqp:transaction:timeout while the younger ones still commit."""
    w = world("minibroker", transaction_timeout=100)
    p = peer(w)
    ids = []
    for n in range(5):
        ids.append(declare(w, p))
        if n < 4:
            w.advance(10)
    # now = 40: the first is due at 100, the last at 140
    w.advance(59.5)  # 99.5
    assert len(w.broker.transactions) == 5
    w.advance(1)  # 100.5: only the first
    assert [t.txn_id for t in w.broker.transactions] == ids[1:]
    w.advance(10)  # 110.5: the second too
    assert [t.txn_id for t in w.broker.transactions] == ids[2:]
    state, settled = answer(w, p, p.discharge("ctl", ids[0], fail=False))
    assert isinstance(state, Rejected)
    assert state.error.condition == TIMEOUT
    assert settled
    state, _ = answer(w, p, p.discharge("ctl", ids[2], fail=False))
    assert isinstance(state, Accepted)
    assert w.broker.coordinator.next_deadline() == 130.0
    assert w.broker.internal_errors == 0


def test_default_heap_stays_bounded_when_transactions_time_out_or_connections_drop() -> None:
    """Transactions that end by timing out, by a rollback or by their connection dropping leave no heap entries
    that grow without bound."""
    w = world("minibroker", transaction_timeout=5)
    for round_ in range(300):
        p = peer(w, f"c{round_}")
        a = declare(w, p)
        declare(w, p)
        if round_ % 3 == 0:
            answer(w, p, p.discharge("ctl", a, fail=True))
        if round_ % 2:
            p.close()
            w.settle()
        w.advance(1)
    assert len(w.broker.coordinator._deadlines) <= 2 * len(w.broker.coordinator._open) + 64 + 1
    w.advance(10)
    assert w.broker.transactions == []
    assert w.broker.coordinator.next_deadline() is None
    assert w.broker.internal_errors == 0


def test_broker_j_timer_close_leaves_nothing_behind() -> None:
    """broker-j closes the connection of a transaction that timed out (from its first operation) from a timer: the
    broker does not fail, the connection is gone with amqp:transaction:timeout, its transactions, links and the
    queue's staged count are gone, and another connection of the broker is untouched."""
    w = world("broker-j", transaction_timeout=30)
    p, other = peer(w, "victim"), peer(w, "bystander")
    txn = declare(w, p)
    idle = declare(w, p)  # never used: not timed
    p.attach_producer("in", "q")
    w.settle()
    assert p.transfer("in", payload("m1"), state=TransactionalState(txn_id=txn)) is not None
    w.settle()
    assert census(BrokerView(w))["q"].staged == 1
    w.advance(29)
    assert len(w.broker.transactions) == 2
    other.attach_controller("ctl")
    w.settle()
    w.advance(2)
    seen = w.settle()
    assert seen[p].closed
    assert seen[p].close_error is not None
    assert seen[p].close_error.condition == TIMEOUT
    assert seen[p].close_error.description == "Open transaction timed out"
    assert w.broker.transactions == []
    assert census(BrokerView(w))["q"].staged == 0
    assert p.conn not in w.broker.connections
    assert other.conn in w.broker.connections
    assert w.broker.internal_errors == 0
    assert idle != txn
    # the bystander still works
    other_txn = declare(w, other)
    assert answer(w, other, other.discharge("ctl", other_txn, fail=False))[0] == Accepted()
    w.advance(100)
    assert w.broker.internal_errors == 0


def test_broker_j_two_connections_time_out_in_one_tick() -> None:
    """Two broker-j connections whose transactions time out in the same ``handle_timeout`` are both closed; the
    broker counts no internal error."""
    w = world("broker-j", transaction_timeout=10)
    peers = [peer(w, f"c{n}") for n in range(2)]
    for p in peers:
        txn = declare(w, p)
        p.attach_producer("in", "q")
        w.settle()
        p.transfer("in", payload(p.container_id), state=TransactionalState(txn_id=txn))
        w.settle()
    w.advance(11)
    seen = w.settle()
    assert all(seen[p].closed for p in peers)
    assert w.broker.transactions == []
    assert census(BrokerView(w))["q"].staged == 0
    assert w.broker.internal_errors == 0


def test_two_namespaces_with_different_time_outs_fire_in_order() -> None:
    """A servicebus namespace (120 s from the first operation) and the default (transaction_timeout 60 s from the
    declare) on one broker: the default's fires at 60, servicebus's at first-operation + 120."""
    w = world("minibroker", transaction_timeout=60)
    w.broker.namespace("sb", get("servicebus"))
    mb, sb = peer(w, "mb"), peer(w, "sb", hostname="sb")
    sb_txn = declare(w, sb)
    mb_txn = declare(w, mb)
    w.advance(10)
    sb.attach_producer("in", "q")
    w.settle()
    assert answer(w, sb, sb.transfer("in", payload("m"), state=TransactionalState(txn_id=sb_txn)))[0] == Accepted()
    w.advance(50.5)  # 60.5: the default's is gone, servicebus's (due 130) is not
    assert [t.txn_id for t in w.broker.transactions] == [sb_txn]
    w.advance(69)  # 129.5
    assert [t.txn_id for t in w.broker.transactions] == [sb_txn]
    w.advance(1)  # 130.5
    assert w.broker.transactions == []
    assert answer(w, mb, mb.discharge("ctl", mb_txn, fail=False))[0].error.condition == TIMEOUT
    assert answer(w, sb, sb.discharge("ctl", sb_txn, fail=False))[0].error.condition == TIMEOUT
    assert w.broker.internal_errors == 0


def test_broker_j_counts_only_the_transactions_that_timed_out() -> None:
    """broker-j closes the connection of a transaction that timed out; the other transaction of that connection
    (never used, so never timed) is rolled back by the close but did not time out: ``timed_out`` counts 1 (the
    counter is "rolled back because they outlived transaction_timeout"), ``rolled_back`` counts both."""
    w = world("broker-j", transaction_timeout=10)
    p = peer(w)
    txn = declare(w, p)
    declare(w, p)
    p.attach_producer("in", "q")
    w.settle()
    p.transfer("in", payload("m"), state=TransactionalState(txn_id=txn))
    w.settle()
    w.advance(11)
    w.settle()
    stats = w.broker.txn_stats
    assert stats.timed_out == 1
    assert stats.rolled_back == 2
    assert w.broker.internal_errors == 0
