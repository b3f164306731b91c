"""Review of issue 16: fault injection meeting in-doubt transactions (check-back), on the pure core."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import TransactionalState
from minibroker.broker.checkback import CheckBackSettings
from minibroker.broker.core import Broker
from minibroker.broker.settings import BrokerSettings
from tests.broker.test_in_doubt import PRODUCER, checker, declare, producer, ready, received, states, tell
from tests.broker.txn_driver import BrokerView, World, payload


def world(**check: Any) -> World:
    return World(Broker(BrokerSettings(check_back=CheckBackSettings(**check))))


def commit_under_fault(action: str) -> tuple[World, BrokerView, bytes]:
    """A check-back producer posts m1 in a transaction and commits it while discharge fault ``action`` is set; its
    connection is gone afterwards. The world, its view and the txn-id."""
    w = world()
    view = BrokerView(w)
    view.faults.add("discharge", action)
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    w.settle()
    peer.discharge("ctl", txn, fail=False)
    w.settle()
    assert peer.conn.finished
    return w, view, txn


def test_lose_outcome_then_query_answers_committed_exactly_once() -> None:
    """lose-outcome on a check-back controller's commit: the commit is applied, the connection dropped; a
    returning producer's outcome query must say "committed" (not "unknown"/"in-doubt") and the message is there
    once, with nothing left in doubt."""
    w, view, txn = commit_under_fault("lose-outcome")
    assert ready(w) == ["m1"]
    assert states(w) == []
    back = checker(w)
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    got = received(seen, back)
    assert got == [(txn, {"txn-id": txn.hex(), "state": "committed"})]
    w.advance(3600)  # no check, nothing abandoned, nothing doubled
    assert ready(w) == ["m1"]
    assert view.txn_stats.committed == 1
    assert view.txn_stats.rolled_back == 0
    assert w.broker.internal_errors == 0


def test_drop_connection_on_discharge_with_check_back_is_held_in_doubt() -> None:
    """drop-connection on a check-back controller's discharge cuts the connection before applying: the
    transaction was open when the connection was lost, so (in-doubt section) it is held, not rolled back; a
    query says in-doubt and the producer can still commit it; the message appears once."""
    w, _, txn = commit_under_fault("drop-connection")
    assert ready(w) == []
    assert states(w) == [(txn, "in-doubt")]
    back = checker(w)
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert received(seen, back) == [(txn, {"txn-id": txn.hex(), "state": "in-doubt", "posts": 1})]
    tell(w, back, txn_id=txn.hex(), outcome="commit")
    assert ready(w) == ["m1"]
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert received(seen, back) == [(txn, {"txn-id": txn.hex(), "state": "committed"})]
    assert w.broker.internal_errors == 0


def test_check_back_and_fault_delay_obey_only_the_broker_clock() -> None:
    """A delayed discharge (fault delay) and the check-back schedule both run on broker time: nothing moves
    until advance, and advance fires both."""
    w = world(check_immunity=60, check_interval=30, check_max=1)
    view = BrokerView(w)
    view.faults.add("discharge", "delay", delay=10)
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    w.settle()
    delivery = peer.discharge("ctl", txn, fail=False)
    assert delivery not in w.settle()[peer].answers
    w.advance(9.9)
    assert delivery not in w.settle()[peer].answers
    w.advance(0.2)
    assert delivery in w.settle()[peer].answers
    assert ready(w) == ["m1"]
    # now an in-doubt one: checked at 60, abandoned at 90
    txn2 = declare(w, peer)
    peer.transfer("out", payload("m2"), state=TransactionalState(txn_id=txn2))
    w.settle()
    back = checker(w, PRODUCER)
    peer.eof()
    w.settle()
    assert (txn2, "in-doubt") in states(w)
    w.advance(59)
    assert received(w.settle(), back) == []
    w.advance(1)
    assert [p["check"] for _, p in received(w.settle(), back)] == [1]
    w.advance(30)
    assert states(w) == []
    assert view.txn_stats.abandoned == 1
    assert ready(w) == ["m1"]
    assert w.broker.internal_errors == 0


def test_a_query_tells_how_many_posts_an_in_doubt_transaction_holds() -> None:
    """The connection is cut by ``transfer`` ``drop-connection`` before the post arrives: the transaction is in
    doubt with no post. A producer that commits whatever is "in-doubt" (the README's example, as it was) loses the
    order; the query's answer must say how many posts the broker holds so the producer can tell."""
    w = world()
    view = BrokerView(w)
    view.faults.add("transfer", "drop-connection", address="q")
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    w.settle()
    assert peer.conn.finished
    assert states(w) == [(txn, "in-doubt")]
    back = checker(w)
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert received(seen, back) == [(txn, {"txn-id": txn.hex(), "state": "in-doubt", "posts": 0})]
    assert w.broker.internal_errors == 0


def test_a_query_from_a_second_connection_sees_a_transaction_still_open_on_the_first() -> None:
    """Half-open TCP: the producer's first connection is not yet known lost (its transaction still open) when it
    reconnects with the same container-id and asks. "unknown" would make it send the order again, and the first
    transaction, held in doubt when the loss is noticed, could then be committed too: a duplicate. The answer must
    be "in-doubt" (the issue: a transaction "not ended yet")."""
    w = world()
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    w.settle()
    back = checker(w)  # same container, another connection; the first is still up
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert received(seen, back) == [(txn, {"txn-id": txn.hex(), "state": "in-doubt", "posts": 1})]
    assert w.broker.internal_errors == 0
