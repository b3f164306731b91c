"""Review of issue 17 item 9 (send-via, one-entity transactions), frame by frame: a rollback leaves no message at
an auto-created destination, a transaction discharged while a send-via is half transferred (more=true) does not
deliver its rest, and a via or destination named in another case is the same entity."""

from __future__ import annotations

import pytest

from minibroker.amqp.definitions import Accepted, Rejected, TransactionalState
from tests.personalities.harness import declare, discharge, payload, peer, post, ready, world
from tests.servicebus.test_send_via_frames import attach_via

pytestmark = pytest.mark.timeout(30)


def test_rollback_of_a_send_via_to_an_auto_created_destination() -> None:
    """The destination ``b`` made by the attach may stay (empty), its message must not."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    assert post(w, p, "via", "m", txn_id) == (Accepted(), True)
    assert discharge(w, p, txn_id, fail=True) == (Accepted(), True)
    assert (ready(w, "a"), ready(w, "b")) == ([], [])
    assert post(w, p, "via", "after") == (Accepted(), True)  # the link still works, outside a transaction
    assert ready(w, "b") == ["after"]


def test_a_send_via_half_sent_when_its_transaction_rolls_back() -> None:
    """The first frame (more=true) in the transaction, the rollback, then the last frame: the message is not
    delivered to the destination (its transaction is gone: rejected), nor to the via entity."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    data = payload("half")
    p.begin_transfer("via", data[:3], state=TransactionalState(txn_id=txn_id))
    w.settle()
    assert discharge(w, p, txn_id, fail=True) == (Accepted(), True)
    delivery_id = p.end_transfer("via", data[3:])
    state, _settled = w.settle()[p].answers[delivery_id]
    if isinstance(state, TransactionalState):
        state = state.outcome
    assert isinstance(state, Rejected), state
    assert (ready(w, "a"), ready(w, "b")) == ([], [])


def test_a_send_via_half_sent_when_its_transaction_commits() -> None:
    """The same with a commit before the last frame: the commit cannot include a message not yet whole (it
    fails, or the message is refused): never a message delivered outside the transaction's outcome."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    data = payload("half")
    p.begin_transfer("via", data[:3], state=TransactionalState(txn_id=txn_id))
    w.settle()
    committed, _ = discharge(w, p, txn_id, fail=False)
    delivery_id = p.end_transfer("via", data[3:])
    state, _settled = w.settle()[p].answers[delivery_id]
    if isinstance(state, TransactionalState):
        state = state.outcome
    assert isinstance(state, Rejected) or isinstance(committed, Rejected), (committed, state)
    assert ready(w, "a") == []
    assert ready(w, "b") == ([] if isinstance(state, Rejected) else ["half"])


def test_via_and_destination_under_other_cases() -> None:
    """``A`` via for ``b``, then a receive-side transaction on ``a`` and a send via ``A`` to ``B``: one entity
    each; the commit delivers to ``b``."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "A", "b")
    assert post(w, p, "via", "one") == (Accepted(), True)
    attach_via(p, "via2", "a", "B")
    txn_id = declare(w, p)
    assert post(w, p, "via2", "two", txn_id) == (Accepted(), True)
    assert post(w, p, "via", "three", txn_id) == (Accepted(), True)  # the same top-level entity
    assert discharge(w, p, txn_id) == (Accepted(), True)
    assert ready(w, "b") == ["one", "two", "three"]
    assert ready(w, "a") == []


def test_a_cross_entity_session_receiver_on_its_entity_in_another_case() -> None:
    """A cross-entity session (coordinator first) whose first sender is on ``A``: a receiver on ``a`` is on the
    same entity and is taken."""
    w = world("servicebus")
    p = peer(w)
    p.attach_controller("ctl")
    p.attach_producer("pa", "A")
    w.settle()
    p.attach_consumer("ca", "a", presettled=False, default_outcome=None)
    seen = w.settle()[p]
    assert seen.attached["ca"].source is not None
    assert seen.detached == []
