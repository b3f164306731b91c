"""The ``artemis`` personality (Apache ActiveMQ Artemis): one test per quirk, each running the same client steps under
``minibroker`` and under ``artemis`` and asserting the difference on the wire.

Sources are the files ``ARTEMIS.quirks`` cites, under ``artemis-protocols/artemis-amqp-protocol/src/main/java/
org/apache/activemq/artemis/protocol/amqp/`` of apache/activemq-artemis; the specification is OASIS AMQP 1.0.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Declare,
    Declared,
    Error,
    Modified,
    Rejected,
    Released,
    TransactionalState,
)
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.personality import ARTEMIS
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, Peer, World, census, payload
from tests.personalities.harness import (
    FULL_Q,
    UNKNOWN_ID,
    answer,
    check_flow_txn_id_ignored,
    declare,
    discharge_unknown,
    failed_commit,
    peer,
    receive,
    rejected_with,
    retire_in_txn,
    seed,
    txn_ids,
    world,
)

RCV_SECOND = UInt(1)


def test_every_quirk_has_a_test() -> None:
    """This file has one test per quirk ``ARTEMIS`` lists (the tests below follow their order)."""
    assert len(ARTEMIS.quirks) == 11


# -- quirk 1 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("outcome", [Released(), Rejected(), Modified()], ids=["released", "rejected", "modified"])
def test_transactional_retirement_other_than_accepted_is_ignored(outcome: Any) -> None:
    """Quirk 1: Artemis honours only ``accepted`` in a transactional disposition (ProtonServerSenderContext
    handleExtendedDeliveryOutcomes): no disposition at the commit, and the message stays acquired by the first
    consumer (a second one with credit gets nothing). minibroker stages the outcome (§4.4.2) and applies it at the
    commit: it settles the delivery with that outcome, and the message leaves the first consumer."""
    mb = retire_in_txn(world("minibroker"), outcome)
    assert mb.at_retirement.settled_by_broker == []  # staged: nothing before the commit
    assert mb.at_commit.settled_by_broker == [(0, outcome)]
    redelivered = ["m1"] if not isinstance(outcome, Rejected) else []  # rejected: dead-lettered
    assert [s.name for s in mb.at_commit.started] == redelivered
    assert mb.queue.ready == ()
    assert mb.queue.acquired == len(redelivered)

    artemis = retire_in_txn(world("artemis"), outcome)
    assert artemis.at_retirement.settled_by_broker == artemis.at_commit.settled_by_broker == []
    assert artemis.at_commit.started == []
    assert artemis.at_commit.answers == {2: (Accepted(), True)}  # the commit (delivery 2) succeeds
    assert (artemis.queue.ready, artemis.queue.acquired) == ((), 1)


def test_transactional_accept_is_honoured_by_both() -> None:
    """Quirk 1, its other half: a transactional ``accepted`` is applied at the commit under both personalities,
    which settle the delivery ``accepted`` and empty the queue (§4.4.2)."""
    for name in ("minibroker", "artemis"):
        seen = retire_in_txn(world(name), Accepted())
        assert seen.at_commit.settled_by_broker == [(0, Accepted())], name
        assert (seen.queue.ready, seen.queue.acquired) == ((), 0), name


# -- quirk 2 -------------------------------------------------------------------------------------------------------
def attach_second_and_post(name: str) -> tuple[Any, Any, tuple[Any, bool]]:
    """A producer and a consumer attached asking rcv-settle-mode second, then a post on the producer: the
    rcv-settle-mode of the broker's two attaches and its answer to the post."""
    w = world(name)
    p = peer(w)
    p.send(frames.attach_sender("q", p.new_handle("prod"), "prod", rcv_settle_mode=RCV_SECOND))
    p.send(frames.attach_receiver("q", p.new_handle("cons"), "cons", rcv_settle_mode=RCV_SECOND))
    attached = w.settle()[p].attached
    return (
        attached["prod"].rcv_settle_mode,
        attached["cons"].rcv_settle_mode,
        answer(w, p, p.transfer("prod", payload("m1"))),
    )


def test_rcv_settle_second_is_answered_first() -> None:
    """Quirk 2: Artemis answers rcv-settle-mode second with first on consumer and producer links
    (DefaultSenderController init, ProtonServerReceiverContext initialize), and settles its answer to a post at
    once; minibroker echoes second (§2.8.3) and leaves the outcome unsettled for the producer to settle first."""
    assert attach_second_and_post("minibroker") == (1, 1, (Accepted(), False))
    assert attach_second_and_post("artemis") == (0, 0, (Accepted(), True))


# -- quirk 3 -------------------------------------------------------------------------------------------------------
def test_discharge_of_unknown_id() -> None:
    """Quirk 3: a discharge naming no transaction is rejected with amqp:illegal-state 'AMQ119014: Transaction not
    found: xid=...' (ProtonTransactionHandler txError, AMQPConnectionCallback getTransaction; the id printed as
    proton-j's Binary.toString does), where minibroker answers amqp:transaction:unknown-id (§4.5.5)."""
    state, settled = discharge_unknown(world("minibroker"))
    assert settled
    assert rejected_with(state) == ("amqp:transaction:unknown-id", "unknown transaction id 6e6f706501")
    state, settled = discharge_unknown(world("artemis"))
    assert settled
    assert rejected_with(state) == ("amqp:illegal-state", "AMQ119014: Transaction not found: xid=nope\\x01")


# -- quirk 4 -------------------------------------------------------------------------------------------------------
def test_commit_failure_conditions() -> None:
    """Quirk 4: a commit that cannot be applied is rejected with the bare symbol ``failed`` (ProtonTransactionHandler
    txError), or with the refused post's own condition when a refused post was the cause; minibroker answers
    amqp:transaction:rollback in both cases (§4.5.5: "the transaction was rolled back")."""
    state, _ = failed_commit(world("minibroker"), "deleted")
    assert rejected_with(state) == ("amqp:transaction:rollback", "transaction rolled back: node 'q' was deleted")
    state, _ = failed_commit(world("artemis"), "deleted")
    assert rejected_with(state) == ("failed", "node 'q' was deleted")

    full = "node 'q' is full (1 messages, 11 bytes)"
    state, _ = failed_commit(world("minibroker", **FULL_Q), "refused")
    assert rejected_with(state) == ("amqp:transaction:rollback", f"transaction rolled back: {full}")
    state, _ = failed_commit(world("artemis", **FULL_Q), "refused")
    assert rejected_with(state) == ("amqp:resource-limit-exceeded", full)


# -- quirk 5 -------------------------------------------------------------------------------------------------------
def post_in_unknown_txn(name: str) -> tuple[tuple[Any, bool], Any]:
    """A transfer naming ``UNKNOWN_ID``: the broker's answer to it, and the error of the connection's close."""
    w = world(name)
    p = peer(w)
    p.attach_producer("prod", "q")
    w.settle()
    state = answer(w, p, p.transfer("prod", payload("m1"), state=TransactionalState(txn_id=UNKNOWN_ID)))
    return state, p.client.remote_close and p.client.remote_close.error


def retire_in_unknown_txn(name: str) -> tuple[list[tuple[int, Any]], Any]:
    """A delivery given ``transactional-state(UNKNOWN_ID, accepted)`` unsettled: what the broker settled, and the
    error of the connection's close."""
    w = world(name)
    p = peer(w)
    seed(w, p, "q", "m1")
    (delivery,) = receive(w, p, "c", "q")
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=UNKNOWN_ID, outcome=Accepted()), settled=False)
    settled = w.settle()[p].settled_by_broker
    return settled, p.client.remote_close and p.client.remote_close.error


def test_unknown_txn_id_in_transfer_or_disposition_closes_the_connection() -> None:
    """Quirk 5: a transfer naming an unknown txn-id closes the connection with amqp:internal-error 'AMQ119014:
    Transaction not found' (ProtonAbstractReceiver onMessageComplete, ProtonHandler), a disposition with
    'Unrecoverable error: AMQ119014: ...'; minibroker rejects the transfer with amqp:transaction:unknown-id and
    releases the delivery (the outcome cannot be applied), keeping the connection."""
    state, close = post_in_unknown_txn("minibroker")
    assert close is None
    assert rejected_with(state[0]) == ("amqp:transaction:unknown-id", "unknown transaction id 6e6f706501")
    assert post_in_unknown_txn("artemis") == (
        (None, False),
        Error(condition=Symbol("amqp:internal-error"), description="AMQ119014: Transaction not found: xid=nope\\x01"),
    )

    assert retire_in_unknown_txn("minibroker") == ([(0, Released())], None)
    settled, close = retire_in_unknown_txn("artemis")
    assert settled == []
    assert close == Error(
        condition=Symbol("amqp:internal-error"),
        description="Unrecoverable error: AMQ119014: Transaction not found: xid=nope\\x01",
    )


# -- quirk 6 -------------------------------------------------------------------------------------------------------
def posted_then_controller_detached(name: str) -> tuple[World, Peer, bytes]:
    """A world of ``name`` where message m1 was posted to queue ``q`` in a transaction whose controller then
    detached: the world, the peer and the txn-id."""
    w = world(name)
    p = peer(w)
    txn_id = declare(w, p)
    p.attach_producer("prod", "q")
    answer(w, p, p.transfer("prod", payload("m1"), state=TransactionalState(txn_id=txn_id)))
    p.detach("ctl")
    return w, p, txn_id


def commit_after_controller_detached(name: str) -> tuple[Any, tuple[Any, ...]]:
    """A post in a transaction, its controller detached, then a second controller of the connection commits the
    txn-id: the answer to that commit, and what queue ``q`` holds."""
    w, p, txn_id = posted_then_controller_detached(name)
    w.settle()
    p.attach_controller("ctl2")
    state, _ = answer(w, p, p.discharge("ctl2", txn_id, fail=False))
    return state, census(BrokerView(w))["q"].ready


def close_with_posted(name: str) -> tuple[Any, ...]:
    """A post in a transaction, its controller detached, then the connection closed: what queue ``q`` holds."""
    w, p, _ = posted_then_controller_detached(name)
    p.close()
    w.settle()
    return census(BrokerView(w))["q"].ready


def test_controller_detach_rolls_nothing_back() -> None:
    """Quirk 6: detaching Artemis's coordinator rolls nothing back (ProtonTransactionHandler close): another
    coordinator link of the connection commits the txn-id, and the message appears; minibroker rolls the
    transaction back when its controller link closes (Part 4 §4 intro), so the id is unknown and nothing appears.
    Closing the connection rolls back under both (AMQPConnectionCallback close)."""
    state, ready = commit_after_controller_detached("minibroker")
    assert rejected_with(state)[0] == "amqp:transaction:unknown-id"
    assert ready == ()
    assert commit_after_controller_detached("artemis") == (Accepted(), (("m1", 0),))

    assert close_with_posted("minibroker") == close_with_posted("artemis") == ()


# -- quirk 7 -------------------------------------------------------------------------------------------------------
def post_in_txn(name: str, *, rcv_second: bool, **settings: Any) -> tuple[Any, bool]:
    """A transactional post on a producer link (asking rcv-settle-mode second if ``rcv_second``) to queue ``q``
    holding one message already: the broker's provisional answer."""
    w = world(name, **settings)
    p = peer(w)
    txn_id = declare(w, p)
    seed(w, p, "q", "m0")
    mode = RCV_SECOND if rcv_second else None
    p.send(frames.attach_sender("q", p.new_handle("prod"), "prod", rcv_settle_mode=mode))
    return answer(w, p, p.transfer("prod", payload("m1"), state=TransactionalState(txn_id=txn_id)))


def test_provisional_outcome_of_a_post() -> None:
    """Quirk 7: Artemis sends the provisional ``transactional-state(accepted)`` settled even to a producer asking
    rcv-settle-mode second (AMQPSessionCallback inSessionSend), where minibroker leaves it unsettled (§2.7.3,
    §4.4.1); a post it cannot take (a full queue) gets a plain ``rejected`` (ProtonAbstractReceiver
    deliveryFailed), where minibroker wraps it in transactional-state."""
    state, settled = post_in_txn("minibroker", rcv_second=True)
    assert isinstance(state, TransactionalState)
    assert isinstance(state.outcome, Accepted)
    assert not settled
    state, settled = post_in_txn("artemis", rcv_second=True)
    assert isinstance(state, TransactionalState)
    assert isinstance(state.outcome, Accepted)
    assert settled

    state, _ = post_in_txn("minibroker", rcv_second=False, **FULL_Q)
    assert isinstance(state, TransactionalState)
    assert rejected_with(state.outcome)[0] == "amqp:resource-limit-exceeded"
    state, _ = post_in_txn("artemis", rcv_second=False, **FULL_Q)
    assert rejected_with(state)[0] == "amqp:resource-limit-exceeded"


# -- quirk 8 -------------------------------------------------------------------------------------------------------
def test_flow_txn_id_is_ignored() -> None:
    """Quirk 8: Artemis ignores a flow's txn-id (AMQPConnectionContext onFlow): the transfer carries no state and
    the rollback leaves it acquired; minibroker acquires under the transaction (§4.4.3: the transfer carries
    ``transactional-state(txn-id)``) and the rollback releases it back to the queue."""
    check_flow_txn_id_ignored("artemis")


# -- quirk 9 -------------------------------------------------------------------------------------------------------
def declare_global(name: str) -> tuple[Any, bool]:
    """The answer to a declare carrying a global-id."""
    w = world(name)
    p = peer(w)
    p.attach_controller("ctl")
    return answer(w, p, p.control("ctl", frames.message(AmqpValue(Declare(global_id=b"global")))))


def test_global_id_is_ignored() -> None:
    """Quirk 9: Artemis declares a transaction whatever the declare's global-id (ProtonTransactionHandler
    onMessage); minibroker refuses distributed transactions with amqp:not-implemented (§4.5.2 / §4.5.8)."""
    state, _ = declare_global("minibroker")
    assert rejected_with(state)[0] == "amqp:not-implemented"
    state, settled = declare_global("artemis")
    assert isinstance(state, Declared)
    assert settled


# -- quirk 10 ------------------------------------------------------------------------------------------------------
UUID_TEXT = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_txn_ids_are_uuid_text() -> None:
    """Quirk 10: Artemis's txn-ids are the ASCII text of a UUID, 36 octets (AMQPConnectionCallback newTransaction:
    ``generateStringUUID().getBytes()``); minibroker's are 16 opaque octets."""
    ids = txn_ids(world("minibroker"))
    assert [len(i) for i in ids] == [16, 16]
    assert not any(UUID_TEXT.fullmatch(i) for i in ids)
    ids = txn_ids(world("artemis"))
    assert len(set(ids)) == 2
    assert all(len(i) == 36 and UUID_TEXT.fullmatch(i) for i in ids), ids


# -- quirk 11 ------------------------------------------------------------------------------------------------------
def rollback_accepted(name: str) -> tuple[list[tuple[int, Any]], int, tuple[Any, ...]]:
    """A delivery given ``transactional-state(txn, accepted)`` unsettled, then the transaction rolled back: what
    the broker settled, and queue ``q``'s acquired and ready messages."""
    w = world(name)
    p = peer(w)
    txn_id = declare(w, p)
    seed(w, p, "q", "m1")
    (delivery,) = receive(w, p, "c", "q")
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=False)
    p.discharge("ctl", txn_id, fail=True)
    settled = w.settle()[p].settled_by_broker
    queue = census(BrokerView(w))["q"]
    return settled, queue.acquired, queue.ready


def test_rollback_leaves_accepted_delivery_acquired_in_both() -> None:
    """Quirk 11 (no difference): a rollback leaves an accepted, unsettled delivery acquired by its consumer under
    Artemis (ProtonTransactionRefsOperation rollbackRedelivery) as under minibroker (§4.4.2: the outcome is undone,
    the delivery is back to the state it had): nothing settled, nothing back on the queue."""
    assert rollback_accepted("minibroker") == rollback_accepted("artemis") == ([], 1, ())
