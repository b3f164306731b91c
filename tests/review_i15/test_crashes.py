"""Review of issue 15: crashes, lost or duplicated messages and stuck transactions under the personalities (the
broker's contained internal errors, ``Broker.internal_errors``, must stay 0)."""

from __future__ import annotations

from minibroker.amqp.definitions import Accepted, Released, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, census, payload
from tests.personalities.harness import answer, declare, peer, receive, seed, world

INTERNAL = Symbol("amqp:internal-error")
UNKNOWN = b"nope\x01"


def test_artemis_unknown_txn_in_a_disposition_range_closes_once() -> None:
    """artemis: one disposition covering two deliveries names an unknown txn-id: the connection is closed with
    amqp:internal-error (as Artemis does) exactly once, no internal error is counted, and both messages go back."""
    w = world("artemis")
    p = peer(w)
    seed(w, p, "q", "m1", "m2")
    started = receive(w, p, "c", "q", credit=2)
    assert [s.name for s in started] == ["m1", "m2"]
    p.send(frames.disposition(0, 1, settled=False, state=TransactionalState(txn_id=UNKNOWN, outcome=Accepted())))
    seen = w.settle()
    assert seen[p].closed
    assert seen[p].close_error.condition == INTERNAL
    assert w.broker.internal_errors == 0
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1", "m2"]


def test_artemis_two_unknown_txn_posts_in_one_read() -> None:
    """artemis: two transfers naming an unknown txn-id in one read (read ahead on a producer link): the connection
    closes once, nothing is staged or stored, no internal error."""
    w = world("artemis")
    p = peer(w)
    p.attach_producer("in", "q")
    w.settle()
    state = TransactionalState(txn_id=UNKNOWN)
    h = p.handle("in")
    first = p.client.next_delivery_id()
    p.client.send(frames.transfer(h, first, state=state), 0, payload("a"))
    p.client.send(frames.transfer(h, first + 1, state=state), 0, payload("b"))
    p._feed()
    seen = w.settle()
    assert seen[p].closed
    assert seen[p].close_error.condition == INTERNAL
    assert w.broker.internal_errors == 0
    assert census(BrokerView(w))["q"] == census(BrokerView(w))["q"].__class__((), 0, 0)


def test_artemis_unknown_txn_on_multi_frame_and_presettled_transfers() -> None:
    """artemis: an unknown txn-id on a multi-frame transfer (named on the first frame only) and on a pre-settled
    transfer: each closes its connection with amqp:internal-error and stores nothing."""
    w = world("artemis")
    for settled in (False, True):
        p = peer(w, f"c{settled}")
        p.attach_producer("in", "q")
        w.settle()
        data = payload("big", big=True)
        p.begin_transfer("in", data[:100], state=TransactionalState(txn_id=UNKNOWN), settled=settled)
        w.settle()
        p.end_transfer("in", data[100:])
        seen = w.settle()
        assert seen[p].closed, settled
        assert seen[p].close_error.condition == INTERNAL, settled
    assert w.broker.internal_errors == 0
    assert "q" not in census(BrokerView(w)) or census(BrokerView(w))["q"].ready == ()


def test_artemis_ignored_release_then_detach_or_close_returns_the_message_once() -> None:
    """artemis ignores a transactional ``released``: the message stays with the consumer. When that consumer
    detaches (or its connection closes) the message comes back exactly once, and a commit of the transaction
    afterwards does not bring it back a second time."""
    for ending in ("detach", "close"):
        w = world("artemis")
        ctl = p = peer(w, "ctl")  # (txn-ids are per connection under artemis)
        txn = declare(w, ctl)
        seed(w, ctl, "q", "m1")
        (d,) = receive(w, p, "c", "q")
        p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Released()), settled=True)
        w.settle()
        assert census(BrokerView(w))["q"].acquired == 1
        if ending == "detach":
            p.detach("c")
            w.settle()
            assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1"], ending
            assert answer(w, ctl, ctl.discharge("ctl", txn, fail=False))[0] == Accepted()
        else:
            p.close()
            w.settle()
        assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1"], ending
        assert census(BrokerView(w))["q"].acquired == 0
        assert w.broker.internal_errors == 0


def test_activemq_answered_retirement_then_client_settles_then_commit() -> None:
    """activemq answers a transactional ``accepted`` at once with an unsettled transactional-state; the client then
    settles the delivery itself, and the commit runs: no internal error, no protocol violation, the message is
    gone for good (and a rollback instead returns it once)."""
    for fail in (False, True):
        w = world("activemq")
        p = peer(w)
        txn = declare(w, p)
        seed(w, p, "q", "m1")
        (d,) = receive(w, p, "c", "q")
        p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=False)
        seen = w.settle()[p]
        assert [u[0] for u in seen.updated] == [d.delivery_id]
        p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=True)
        seen = w.settle()[p]
        assert seen.violations == []
        assert answer(w, p, p.discharge("ctl", txn, fail=fail))[0] == Accepted()
        q = census(BrokerView(w))["q"]
        if fail:  # rolled back: the outcome is dropped; the delivery, settled by the client, is back once
            p.detach("c")
            w.settle()
            q = census(BrokerView(w))["q"]
            assert [n for n, _ in q.ready] == ["m1"]
            assert q.acquired == 0
        else:
            assert (q.ready, q.acquired) == ((), 0)
        assert w.broker.internal_errors == 0


def test_activemq_answered_retirement_on_a_browser_is_not_sent() -> None:
    """activemq: a browser's transactional ``accepted`` changes nothing and is not answered with an unsettled
    transactional-state (a browsed copy is settled with the outcome it was given)."""
    w = world("activemq")
    p = peer(w)
    txn = declare(w, p)
    seed(w, p, "q", "m1")
    from minibroker.amqp.definitions import Source

    p.send(
        frames.attach_receiver(
            "q", p.new_handle("b"), "b", source=Source(address="q", distribution_mode=Symbol("copy"))
        )
    )
    p.flow("b", 1)
    (d,) = w.settle()[p].started
    p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=False)
    seen = w.settle()[p]
    assert seen.updated == []
    assert seen.violations == []
    assert w.broker.internal_errors == 0
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1"]


def test_proton_shared_id_declarer_closes_while_another_connection_posted() -> None:
    """proton shares txn-ids across the namespace: connection B posts under A's transaction, then A closes. The
    transaction rolls back (B's post is not stored), B's later use of the id is unknown, no internal error."""
    w = world("proton")
    a, b = peer(w, "a"), peer(w, "b")
    txn = declare(w, a)
    b.attach_producer("in", "q")
    w.settle()
    assert isinstance(
        answer(w, b, b.transfer("in", payload("m1"), state=TransactionalState(txn_id=txn)))[0], TransactionalState
    )
    assert census(BrokerView(w))["q"].staged == 1
    a.close()
    w.settle()
    assert w.broker.transactions == []
    assert census(BrokerView(w))["q"].staged == 0
    assert census(BrokerView(w))["q"].ready == ()
    state, _ = answer(w, b, b.transfer("in", payload("m2"), state=TransactionalState(txn_id=txn)))
    assert state is not None
    assert not isinstance(state, TransactionalState | Accepted)
    assert w.broker.internal_errors == 0


def test_proton_shared_id_retiring_connection_closes_before_the_commit() -> None:
    """proton: connection B accepts a delivery in A's transaction (unsettled), B closes, then A commits: no internal
    error, and the message is either consumed by the commit or back on the queue exactly once (never both)."""
    w = world("proton")
    a, b = peer(w, "a"), peer(w, "b")
    txn = declare(w, a)
    seed(w, a, "q", "m1")
    (d,) = receive(w, b, "c", "q")
    b.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=False)
    w.settle()
    b.close()
    w.settle()
    assert answer(w, a, a.discharge("ctl", txn, fail=False))[0] == Accepted()
    q = census(BrokerView(w))["q"]
    assert q.acquired == 0
    assert len(q.ready) <= 1
    assert w.broker.internal_errors == 0


def test_proton_shared_id_discharged_by_another_connection() -> None:
    """proton: B commits A's transaction; then A closes: nothing is rolled back twice, no internal error, the post
    is stored once."""
    w = world("proton")
    a, b = peer(w, "a"), peer(w, "b")
    txn = declare(w, a)
    a.attach_producer("in", "q")
    w.settle()
    answer(w, a, a.transfer("in", payload("m1"), state=TransactionalState(txn_id=txn)))
    b.attach_controller("ctl")
    w.settle()
    assert answer(w, b, b.discharge("ctl", txn, fail=False))[0] == Accepted()
    a.close()
    w.settle()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1"]
    assert w.broker.internal_errors == 0


def test_broker_j_ids_reused_after_rollback_never_confuse_two_transactions() -> None:
    """broker-j reuses the lowest free 4-octet id: after rolling back id 0 a new declare gets id 0 again while id 1
    is still open; a post under the reused id goes to the new transaction, and the old one's work is not revived."""
    w = world("broker-j")
    p = peer(w)
    t0, t1 = declare(w, p), declare(w, p)
    assert (t0, t1) == (b"\x00\x00\x00\x00", b"\x00\x00\x00\x01")
    p.attach_producer("in", "q")
    w.settle()
    answer(w, p, p.transfer("in", payload("old"), state=TransactionalState(txn_id=t0)))
    assert answer(w, p, p.discharge("ctl", t0, fail=True))[0] == Accepted()
    t2 = declare(w, p)
    assert t2 == t0
    answer(w, p, p.transfer("in", payload("new"), state=TransactionalState(txn_id=t2)))
    assert answer(w, p, p.discharge("ctl", t2, fail=False))[0] == Accepted()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["new"]
    assert [t.txn_id for t in w.broker.transactions] == [t1]
    assert w.broker.internal_errors == 0


def test_released_message_not_duplicated_under_artemis_rollback() -> None:
    """artemis: a transactional ``accepted`` (unsettled) then rollback leaves the message acquired by the consumer;
    detaching returns it once."""
    w = world("artemis")
    p = peer(w)
    txn = declare(w, p)
    seed(w, p, "q", "m1")
    (d,) = receive(w, p, "c", "q")
    p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=False)
    w.settle()
    assert answer(w, p, p.discharge("ctl", txn, fail=True))[0] == Accepted()
    assert census(BrokerView(w))["q"].acquired == 1
    p.detach("c")
    w.settle()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1"]
    assert w.broker.internal_errors == 0
