"""Service Bus send-via and one-entity transactions frame by frame (issue 17 item 9; in memory, no sockets).

The via-sender's attach is the .NET SDK's (azure-sdk-for-net ``Microsoft.Azure.ServiceBus/src/Core/MessageSender.cs``
``CreateLinkAsync``): target address = the via entity, source address = the client id, the property
``com.microsoft:transfer-destination-address`` = the final destination, nothing else.
"""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import Accepted, Error, Rejected, Source, Target, TransactionalState
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol
from minibroker.servicebus.via import SPAN_TEXT, TRANSFER_DESTINATION
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, Peer, World, census
from tests.personalities.harness import answer, declare, discharge, peer, post, ready, receive, seed, world

pytestmark = pytest.mark.timeout(30)


def attach_via(p: Peer, name: str, via: Any, destination: Any) -> Any:
    """The attach of a .NET via-sender to ``via`` for ``destination`` (``MessageSender.CreateLinkAsync``); the
    broker's answering attach (None when it refused)."""
    p.send(
        frames.attach_sender(
            via,
            p.new_handle(name),
            name,
            source=Source(address="MessageSender1"),
            properties={Symbol(TRANSFER_DESTINATION): destination},
        )
    )
    return p.world.settle()[p].attached.get(name)


def refusal(w: World, p: Peer, name: str, via: Any, destination: Any) -> tuple[str, str | None]:
    """The (condition, description) of the detach that refuses a via-sender's attach (§2.6.3: null target)."""
    reply = attach_via(p, name, via, destination)
    assert reply is not None
    assert reply.target is None, reply
    ((link, err),) = p.observed.detached
    assert link == name
    assert isinstance(err, Error)
    return str(err.condition), err.description


def rejected(state: Any) -> tuple[str, str | None]:
    """The (condition, description) of a rejected outcome (a refused post's comes in its transactional-state)."""
    if isinstance(state, TransactionalState):
        state = state.outcome
    assert isinstance(state, Rejected), state
    assert isinstance(state.error, Error), state
    return str(state.error.condition), state.error.description


def test_via_sender_outside_a_transaction_transfers_to_the_destination() -> None:
    """Outside a transaction a message sent via A is transferred to B (both created on first use)."""
    w = world("servicebus")
    p = peer(w)
    reply = attach_via(p, "via", "amqps://127.0.0.1:5671/a", "b")
    assert (reply.source, reply.target) == (
        Source(address="MessageSender1"),
        Target(address="amqps://127.0.0.1:5671/a"),
    )
    assert post(w, p, "via", "m") == (Accepted(), True)
    assert (ready(w, "a"), ready(w, "b")) == ([], ["m"])


def test_minibroker_ignores_the_transfer_destination_property() -> None:
    """The property is Service Bus's: under minibroker a link to A posts to A."""
    w = world("minibroker")
    p = peer(w)
    attach_via(p, "via", "a", "b")
    post(w, p, "via", "m")
    assert (ready(w, "a"), ready(w, "b")) == (["m"], [])


def _receive_complete_send_via(w: World, *, commit: bool) -> tuple[Any, Any, Any]:
    """A message of A taken, then in one transaction: completed (accepted) and a new one sent via A to B; then
    the discharge. The answers to the post, to the disposition's delivery (what the consumer saw) and to the
    discharge."""
    p = peer(w)
    seed(w, p, "a", "in")
    (delivery,) = receive(w, p, "c", "a")
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    sent = post(w, p, "via", "out", txn_id)
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=True)
    disposed = w.settle()[p]
    return sent, disposed.settled_by_broker, discharge(w, p, txn_id, fail=not commit)


def test_receive_complete_and_send_via_commit_together() -> None:
    w = world("servicebus")
    sent, disposed, discharged = _receive_complete_send_via(w, commit=True)
    assert (sent, disposed, discharged) == ((Accepted(), True), [], (Accepted(), True))
    assert (ready(w, "a"), ready(w, "b")) == ([], ["out"])


def test_receive_complete_and_send_via_roll_back_together() -> None:
    """A rollback: B gets nothing; A's message, settled by the client, is back on A at once, its delivery not
    counted (as a released one; Service Bus would hold it locked until its lock runs out, then count one)."""
    w = world("servicebus")
    _, _, discharged = _receive_complete_send_via(w, commit=False)
    assert discharged == (Accepted(), True)
    queues = census(BrokerView(w))
    assert (queues["a"].ready, queues["b"].ready) == ((("in", 0),), ())


def test_a_transaction_on_two_entities_without_via_is_refused() -> None:
    """Service Bus: a transaction is on the first top-level entity it touches; a send to another one (not via
    it) is rejected with amqp:not-allowed and the commit then fails. minibroker takes both."""

    def steps(name: str) -> tuple[Any, Any, Any, list[Any]]:
        w = world(name)
        p = peer(w)
        p.attach_producer("pa", "a")
        p.attach_producer("pb", "b")
        txn_id = declare(w, p)
        first = post(w, p, "pa", "m1", txn_id)
        second = post(w, p, "pb", "m2", txn_id)
        return first, second, discharge(w, p, txn_id), [ready(w, "a"), ready(w, "b")]

    assert steps("minibroker")[2:] == ((Accepted(), True), [["m1"], ["m2"]])
    first, (state, settled), (outcome, _), queues = steps("servicebus")
    assert first == (Accepted(), True)
    assert settled
    condition, description = rejected(state)
    assert condition == Condition.NOT_ALLOWED
    assert description is not None
    assert description.startswith(SPAN_TEXT)
    assert rejected(outcome)[0] == Condition.TRANSACTION_ROLLBACK
    assert queues == [[], []]


def test_a_completion_on_another_entity_is_refused_and_the_message_kept() -> None:
    """A transaction begun by a send to A cannot complete a message of B: the disposition is answered rejected
    with amqp:not-allowed, the message goes back to B (not lost), the commit fails."""
    w = world("servicebus")
    p = peer(w)
    seed(w, p, "b", "in")
    (delivery,) = receive(w, p, "c", "b")
    p.attach_producer("pa", "a")
    txn_id = declare(w, p)
    post(w, p, "pa", "m1", txn_id)
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=False)
    ((delivery_id, state),) = w.settle()[p].settled_by_broker
    assert delivery_id == delivery.delivery_id
    assert rejected(state)[0] == Condition.NOT_ALLOWED
    assert rejected(discharge(w, p, txn_id)[0])[0] == Condition.TRANSACTION_ROLLBACK
    assert (ready(w, "a"), ready(w, "b")) == ([], ["in"])


def test_subscription_and_dead_letter_queue_count_as_their_entity() -> None:
    """A subscription belongs to its topic and a dead-letter queue to its queue: one entity for the rule."""
    w = world("servicebus")
    p = peer(w)
    seed(w, p, "q/$DeadLetterQueue", "dead")
    (delivery,) = receive(w, p, "c", "q/$DeadLetterQueue")
    p.attach_producer("pq", "q")
    txn_id = declare(w, p)
    assert post(w, p, "pq", "m", txn_id) == (Accepted(), True)
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=True)
    assert w.settle()[p].settled_by_broker == []
    assert discharge(w, p, txn_id) == (Accepted(), True)
    assert (ready(w, "q"), ready(w, "q/$DeadLetterQueue")) == (["m"], [])


def test_two_destinations_via_the_transaction_entity_commit_together() -> None:
    """Two via-senders through A to B and C in one transaction: both land at commit."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "to-b", "a", "b")
    attach_via(p, "to-c", "a", "c")
    txn_id = declare(w, p)
    assert post(w, p, "to-b", "mb", txn_id) == (Accepted(), True)
    assert post(w, p, "to-c", "mc", txn_id) == (Accepted(), True)
    assert [ready(w, q) for q in "abc"] == [[], [], []]
    assert discharge(w, p, txn_id) == (Accepted(), True)
    assert [ready(w, q) for q in "abc"] == [[], ["mb"], ["mc"]]


def test_a_second_via_entity_in_one_transaction_is_refused() -> None:
    """Sending via X in a transaction that is on A is work on X: refused as any second entity is."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via-a", "a", "b")
    attach_via(p, "via-x", "x", "c")
    txn_id = declare(w, p)
    post(w, p, "via-a", "m1", txn_id)
    assert rejected(post(w, p, "via-x", "m2", txn_id)[0])[0] == Condition.NOT_ALLOWED


def test_destination_equal_to_the_via_is_a_plain_sender() -> None:
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "a", "amqps://host/a")
    assert post(w, p, "via", "m") == (Accepted(), True)
    assert ready(w, "a") == ["m"]


@pytest.mark.parametrize(
    ("destination", "reason"),
    [
        ("", "names no entity"),
        ("amqps://host:5671/", "names no entity"),
        (5, "must be a string"),
        (b"b", "must be a string"),
        (None, "must be a string"),
        ("b\x00c", "NUL"),
        ("$cbs", "service node"),
        ("$management", "service node"),
        ("amqps://host/b/$management", "service node"),
    ],
)
def test_a_bad_destination_refuses_the_attach(destination: Any, reason: str) -> None:
    w = world("servicebus")
    p = peer(w)
    condition, description = refusal(w, p, "via", "a", destination)
    assert condition == "com.microsoft:argument-error"
    assert description is not None
    assert reason in description
    assert ready(w, "a") == []
    assert "b" not in w.broker.default.queues


@pytest.mark.parametrize(("via", "destination"), [("a", "new"), ("new", "a")])
def test_no_room_for_the_via_entity_or_the_destination_refuses_the_attach(via: str, destination: str) -> None:
    """The via entity and the destination are created like any entity: when ``max_nodes`` leaves no room for
    the one that does not exist, the attach is refused with amqp:resource-limit-exceeded."""
    w = world("servicebus", max_nodes=1)
    p = peer(w)
    p.attach_producer("pa", "a")
    w.settle()
    condition, _ = refusal(w, p, "via", via, destination)
    assert condition == Condition.RESOURCE_LIMIT_EXCEEDED
    assert "new" not in w.broker.default.queues


def test_a_via_sender_without_a_target_address_is_refused() -> None:
    w = world("servicebus")
    p = peer(w)
    condition, description = refusal(w, p, "via", None, "b")
    assert condition == "com.microsoft:argument-error"
    assert description is not None
    assert "via entity" in description


def test_a_namespace_reset_before_the_commit_rolls_everything_back() -> None:
    """The via entity deleted (namespace reset) before the commit: the connection is closed, nothing of the
    transaction lands, and a new connection finds the entities empty."""
    w = world("servicebus")
    p = peer(w)
    seed(w, p, "a", "in")
    (delivery,) = receive(w, p, "c", "a")
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    post(w, p, "via", "out", txn_id)
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=True)
    w.settle()
    w.broker.reset()
    assert w.settle()[p].close_error is not None
    assert w.broker.transactions == []
    q = peer(w, "again")
    attach_via(q, "via", "a", "b")
    assert [ready(w, "a"), ready(w, "b")] == [[], []]
    q.attach_controller("ctl")
    assert rejected(answer(w, q, q.discharge("ctl", txn_id, fail=False))[0])[0] == Condition.UNKNOWN_TXN_ID


# -- Azure.Messaging.ServiceBus: EnableCrossEntityTransactions --------------------------------------------------
# One session for every link, its coordinator attached first (AmqpConnectionScope: "the controller needs to be
# opened before the link is established in order to let the service know that there will be cross entity
# transactions on this session"); the first entity used is the one every later send goes via
# (samples/Sample06_Transactions.md, "Transactions across entities").


def test_cross_entity_session_sends_via_its_first_entity() -> None:
    """Receiver on A first, then plain senders to B and C on the same session: one transaction completes A's
    message and sends to B and C, committed together."""
    w = world("servicebus")
    p = peer(w)
    seed(w, p, "a", "in")
    p.detach("seed-a")
    w.settle()
    p.attach_controller("ctl")
    (delivery,) = receive(w, p, "c", "a")
    p.attach_producer("pb", "b")
    p.attach_producer("pc", "amqps://host/c")
    txn_id = declare(w, p)
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=True)
    assert post(w, p, "pb", "mb", txn_id) == (Accepted(), True)
    assert post(w, p, "pc", "mc", txn_id) == (Accepted(), True)
    assert discharge(w, p, txn_id) == (Accepted(), True)
    assert [ready(w, q) for q in "abc"] == [[], ["mb"], ["mc"]]


def test_cross_entity_session_refuses_a_receiver_on_another_entity() -> None:
    """After a sender to A, a receiver on B on that session is refused with amqp:not-allowed (a receive cannot
    go via A); a receiver on A's dead-letter queue is A's and is taken."""
    w = world("servicebus")
    p = peer(w)
    p.attach_controller("ctl")
    p.attach_producer("pa", "a")
    w.settle()
    p.attach_consumer("cb", "b", presettled=False, default_outcome=None)
    seen = w.settle()[p]
    assert seen.attached["cb"].source is None
    ((link, err),) = seen.detached
    assert link == "cb"
    assert isinstance(err, Error)
    assert err.condition == Condition.NOT_ALLOWED
    assert err.description is not None
    assert err.description.startswith(SPAN_TEXT)
    p.attach_consumer("dlq", "a/$DeadLetterQueue", presettled=False, default_outcome=None)
    seen = w.settle()[p]
    assert seen.attached["dlq"].source is not None
    assert seen.detached == []


def test_a_session_without_a_first_coordinator_is_no_cross_entity_session() -> None:
    """The controller attached after the senders: each sender is on its own entity, and one transaction on two
    of them is refused."""
    w = world("servicebus")
    p = peer(w)
    p.attach_producer("pa", "a")
    p.attach_producer("pb", "b")
    p.attach_consumer("cb", "b", presettled=False, default_outcome=None)
    assert w.settle()[p].detached == []
    txn_id = declare(w, p)
    post(w, p, "pa", "m1", txn_id)
    assert rejected(post(w, p, "pb", "m2", txn_id)[0])[0] == Condition.NOT_ALLOWED


def test_the_via_entity_deleted_before_the_commit_fails_it() -> None:
    """Only the via entity deleted before the commit: the messages sent via it cannot be transferred, so the
    commit fails with amqp:transaction:rollback and the destination gets nothing."""
    w = world("servicebus")
    p = peer(w)
    attach_via(p, "via", "a", "b")
    txn_id = declare(w, p)
    assert post(w, p, "via", "out", txn_id) == (Accepted(), True)
    assert w.broker.delete_node(w.broker.default, "a")
    w.settle()
    outcome, settled = discharge(w, p, txn_id)
    assert settled
    condition, description = rejected(outcome)
    assert condition == Condition.TRANSACTION_ROLLBACK
    assert description is not None
    assert "'a'" in description
    assert ready(w, "b") == []
