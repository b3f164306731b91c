"""Review of issue 15: quirks checked against the sources they cite (mirrors of apache/activemq-artemis,
apache/activemq, apache/qpid-broker-j, apache/qpid-proton, rabbitmq/rabbitmq-server), as the wire shows them."""

from __future__ import annotations

from minibroker.amqp.definitions import Accepted, AmqpValue, Declare, Declared, TransactionalState
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, census
from tests.personalities.harness import answer, declare, peer, receive, retire_in_txn, seed, world


def test_artemis_answers_a_transactional_accept_at_once_as_activemq_does() -> None:
    """artemis-protocols/.../proton/ProtonServerSenderContext.java handleExtendedDeliveryOutcomes: for a
    TransactionalState whose outcome is Accepted, ``if (!delivery.remotelySettled())`` it sends
    ``delivery.disposition(txAccepted)`` (transactional-state(txn, accepted), unsettled) at once, the very code
    ActiveMQ 5's AmqpSender has; the commit then settles the delivery accepted."""
    seen = retire_in_txn(world("artemis"), Accepted())
    assert [(d, type(s)) for d, s in seen.at_retirement.updated] == [(0, TransactionalState)]
    ((_, state),) = seen.at_retirement.updated
    assert state.outcome == Accepted()
    assert seen.at_retirement.settled_by_broker == []
    assert seen.at_commit.settled_by_broker == [(0, Accepted())]
    assert (seen.queue.ready, seen.queue.acquired) == ((), 0)


def test_artemis_settled_transactional_accept_is_not_answered() -> None:
    """The same code answers nothing when the client settled its transactional accept (``remotelySettled``): no
    disposition of a delivery the client has forgotten, and the commit still consumes the message."""
    w = world("artemis")
    p = peer(w)
    txn = declare(w, p)
    seed(w, p, "q", "m1")
    (d,) = receive(w, p, "c", "q")
    p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=True)
    seen = w.settle()[p]
    assert seen.updated == []
    assert seen.violations == []
    assert answer(w, p, p.discharge("ctl", txn, fail=False))[0] == Accepted()
    q = census(BrokerView(w))["q"]
    assert (q.ready, q.acquired) == ((), 0)


def test_proton_declares_whatever_the_global_id() -> None:
    """qpid-proton python/examples/broker.py _coordinator_message: any ``amqp:declare:list`` body allocates a
    transaction (``_declare_txn``); the global-id is never looked at, so a declare carrying one is answered
    ``declared`` (minibroker refuses it with amqp:not-implemented)."""
    w = world("proton")
    p = peer(w)
    p.attach_controller("ctl")
    w.settle()
    state, _ = answer(w, p, p.control("ctl", frames.message(AmqpValue(Declare(global_id=b"global")))))
    assert isinstance(state, Declared), state


def test_activemq_numbers_transactions_per_connection() -> None:
    """apache/activemq AmqpConnection.getNextTransactionId: ``new LocalTransactionId(getConnectionId(),
    ++nextTransactionId)``, a counter of the connection: every connection's first transaction is 1, whatever other
    connections declared before."""
    w = world("activemq")
    a, b = peer(w, "a"), peer(w, "b")
    assert [declare(w, a), declare(w, a)] == [(1).to_bytes(8, "big"), (2).to_bytes(8, "big")]
    assert declare(w, b) == (1).to_bytes(8, "big")
    assert declare(w, a) == (3).to_bytes(8, "big")
