"""Review of issue 17 (sessions) frame by frame (the in-memory driver of tests/servicebus/test_session_frames.py):
re-attaching after the session lock was lost, a transactional completion that outlives the session lock, two
NEXT_AVAILABLE receivers arriving together, and listing sessions whose ids
came in several casings."""

from __future__ import annotations

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Properties, TransactionalState
from minibroker.amqp.types import Int, Symbol
from tests.personalities.harness import declare, discharge, peer
from tests.servicebus.test_session_frames import (
    QUEUE,
    SESSION_FILTER,
    _ask,
    _attach,
    _completed_after_flow,
    _mgmt,
    _send,
    _world,
)

pytestmark = pytest.mark.timeout(30)


def test_17b_the_same_link_reattaches_after_its_session_lock_was_lost() -> None:
    w, p = _world()
    _send(w, p, ("m", "s"))
    _attach(w, p, "r", "s", credit=5)
    w.advance(61)
    ((name, err),) = w.settle()[p].detached
    assert (name, str(err.condition)) == ("r", "com.microsoft:session-lock-lost")
    again = _attach(w, p, "r", "s")
    assert again.source.filter == {SESSION_FILTER: "s"}
    (delivery,) = _completed_after_flow(w, p, "r")
    assert (delivery.name, delivery.delivery_count) == ("m", 1)


def test_17b_a_completion_staged_before_the_lock_ran_out_does_not_also_redeliver() -> None:
    """Complete a session message in a transaction, let the session lock run out, commit: the message is either
    gone (the commit completed it) or back for the next receiver (the commit failed), never both, never lost."""
    w, p = _world()
    _send(w, p, ("m", "s"))
    txn_id = declare(w, p)
    _attach(w, p, "r", "s")
    (delivery,) = _completed_after_flow(w, p, "r")
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=True)
    w.settle()
    w.advance(61)
    assert [name for name, _ in w.settle()[p].detached] == ["r"]
    state, _ = discharge(w, p, txn_id)
    _attach(w, p, "next", "s")
    again = _completed_after_flow(w, p, "next")
    if isinstance(state, Accepted):
        assert again == []
    else:
        assert [d.name for d in again] == ["m"]


def test_17b_two_next_available_receivers_arriving_together_get_different_sessions() -> None:
    w, first = _world()
    _send(w, first, ("a1", "a"), ("b1", "b"))
    second = peer(w)
    for p in (first, second):
        p.attach_consumer("r", QUEUE, presettled=False, default_outcome=None, source_filter={SESSION_FILTER: None})
    seen = w.settle()
    chosen = sorted(seen[p].attached["r"].source.filter[SESSION_FILTER] for p in (first, second))
    assert chosen == ["a", "b"]


def test_17b_list_sessions_names_a_session_once_whatever_its_casings() -> None:
    w, p = _mgmt(_world())
    _send(w, p, ("1", "Mixed"), ("2", "mixed"), ("3", "MIXED"))
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"skip": Int(0), "top": Int(10)})
    assert status["statusCode"] == 200
    assert [s.casefold() for s in body["sessions-ids"].items] == ["mixed"]


def test_17b_transactional_acquisition_by_a_session_receiver_is_refused_and_frees_the_session() -> None:
    """Service Bus has no transactional acquisition (the personality refuses a flow's ``txn-id``, Part 4 §4.4.3,
    with ``amqp:not-implemented``): the session receiver's link goes, and with it its session lock, at once; the
    message stays for the session's next receiver, its delivery count untouched."""
    w, p = _world()
    _send(w, p, ("m", "s"))
    txn_id = declare(w, p)
    _attach(w, p, "r", "s")
    p.flow("r", 1, {Symbol("txn-id"): txn_id})
    observed = w.settle()[p]
    assert observed.completed == []
    ((name, err),) = observed.detached
    assert (name, str(err.condition)) == ("r", "amqp:not-implemented")
    assert _attach(w, p, "next", "s").source.filter == {SESSION_FILTER: "s"}
    (delivery,) = _completed_after_flow(w, p, "next")
    assert (delivery.name, delivery.delivery_count) == ("m", 0)


def test_17b_the_session_lock_runs_out_while_a_delivery_is_half_sent() -> None:
    """The receiver's session window lets one frame of a multi-frame delivery through; the lock runs out and the
    link is detached meanwhile. The peer sees no protocol violation (no frame on the detached handle after its
    detach), never a complete delivery, and the message goes to the session's next receiver."""
    w, sender = _world()
    body = "x" * 5_000
    sender.transfer("in", codec.encode(Properties(group_id="s")) + codec.encode(AmqpValue(body)))
    w.settle()
    p = w.connect("slow", max_frame_size=512, window=1)
    w.settle()
    _attach(w, p, "r", "s", credit=1)
    assert p.receiving
    w.advance(61)
    p.open_window(100)
    observed = w.settle()[p]
    assert observed.violations == []
    assert observed.completed == []
    assert [(name, str(err.condition)) for name, err in observed.detached] == [("r", "com.microsoft:session-lock-lost")]
    _attach(w, sender, "next", "s")
    (delivery,) = _completed_after_flow(w, sender, "next")
    assert delivery.delivery_count == 1
