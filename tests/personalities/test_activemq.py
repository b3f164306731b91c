"""The ``activemq`` personality (Apache ActiveMQ 5.x "Classic"): one test per quirk, each running the same client
steps under ``minibroker`` and under ``activemq`` and asserting the difference on the wire.

Sources are the files ``ACTIVEMQ.quirks`` cites, mostly under ``activemq-amqp/src/main/java/org/apache/activemq/
transport/amqp/protocol/`` of apache/activemq; the specification is OASIS AMQP 1.0.
"""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import Accepted, Coordinator, Modified, Rejected, Released, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.broker.personality import ACTIVEMQ, TXN_CAPABILITIES
from minibroker.testing import frames
from tests.personalities.harness import (
    FULL_Q,
    check_flow_txn_id_ignored,
    discharge_unknown,
    failed_commit,
    peer,
    rejected_with,
    retire_in_txn,
    txn_ids,
    world,
)

OURS: list[str] = [Symbol(c) for c in TXN_CAPABILITIES]


def test_every_quirk_has_a_test() -> None:
    """This file has one test per quirk ``ACTIVEMQ`` lists (the tests below follow their order)."""
    assert len(ACTIVEMQ.quirks) == 6


# -- quirk 1 -------------------------------------------------------------------------------------------------------
def test_txn_ids_are_8_octet_counters() -> None:
    """Quirk 1: ActiveMQ's txn-ids are a counter as 8 octets big-endian (AmqpTransactionCoordinator processDelivery,
    AmqpConnection getNextTransactionId: a long), the first 1; minibroker's are 16 opaque octets."""
    assert [len(i) for i in txn_ids(world("minibroker"))] == [16, 16]
    assert txn_ids(world("activemq")) == [(1).to_bytes(8, "big"), (2).to_bytes(8, "big")]


# -- quirk 2 -------------------------------------------------------------------------------------------------------
def coordinator_reply(name: str, capabilities: list[str] | None) -> Any:
    """The coordinator target of the broker's attach answering a controller whose target has ``capabilities``."""
    w = world(name)
    p = peer(w)
    target = Coordinator(capabilities=capabilities)
    p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target))
    return w.settle()[p].attached["ctl"].target


@pytest.mark.parametrize(
    "asked",
    [None, [Symbol("amqp:local-transactions")], [Symbol("amqp:distributed-transactions"), Symbol("x-custom")]],
    ids=["none", "local", "others"],
)
def test_coordinator_target_is_echoed(asked: list[str] | None) -> None:
    """Quirk 2: ActiveMQ answers a coordinator attach with the controller's own target (AmqpConnection
    processLinkOpen, AmqpSession createCoordinator): exactly the capabilities asked for, none if none; minibroker
    answers with the capabilities it has (§4.2: local transactions, several per session, several sessions per
    transaction), whatever was asked."""
    assert coordinator_reply("minibroker", asked) == Coordinator(capabilities=OURS)
    assert coordinator_reply("activemq", asked) == Coordinator(capabilities=asked)


# -- quirk 3 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cause", ["deleted", "refused"])
def test_commit_failure_is_failed(cause: str) -> None:
    """Quirk 3: a commit that cannot be applied is rejected with the bare condition ``failed``
    (AmqpTransactionCoordinator processDelivery), whether a refused post (a full queue) or a deleted queue was the
    cause; minibroker answers amqp:transaction:rollback (§4.5.5)."""
    settings = FULL_Q if cause == "refused" else {}
    why = "node 'q' was deleted" if cause == "deleted" else "node 'q' is full (1 messages, 11 bytes)"
    state, settled = failed_commit(world("minibroker", **settings), cause)
    assert settled
    assert rejected_with(state) == ("amqp:transaction:rollback", f"transaction rolled back: {why}")
    state, settled = failed_commit(world("activemq", **settings), cause)
    assert settled
    assert rejected_with(state) == ("failed", why)


# -- quirk 4 -------------------------------------------------------------------------------------------------------
def test_discharge_of_unknown_id() -> None:
    """Quirk 4: a discharge naming no transaction is rejected with ``failed`` "Transaction '...' has not been
    started." (TransactionBroker getTransaction, the id printed as a Java binary); minibroker answers
    amqp:transaction:unknown-id (§4.5.5)."""
    state, _ = discharge_unknown(world("minibroker"))
    assert rejected_with(state) == ("amqp:transaction:unknown-id", "unknown transaction id 6e6f706501")
    state, _ = discharge_unknown(world("activemq"))
    assert rejected_with(state) == ("failed", "Transaction 'nope\\x01' has not been started.")


# -- quirk 5 -------------------------------------------------------------------------------------------------------
def test_transactional_accept_is_answered_at_once() -> None:
    """Quirk 5: ActiveMQ answers a transactional ``accepted`` of an unsettled delivery at once with a disposition
    (role sender) that does not settle it, carrying ``transactional-state(txn, accepted)`` (AmqpSender delivery);
    minibroker sends nothing until the commit (§4.4.2). Both settle it ``accepted`` at the commit."""
    mb = retire_in_txn(world("minibroker"), Accepted())
    assert mb.at_retirement.updated == mb.at_retirement.settled_by_broker == []
    assert mb.at_commit.settled_by_broker == [(0, Accepted())]

    amq = retire_in_txn(world("activemq"), Accepted())
    assert amq.at_retirement.updated == [(0, TransactionalState(txn_id=(1).to_bytes(8, "big"), outcome=Accepted()))]
    assert amq.at_retirement.settled_by_broker == []
    assert amq.at_retirement.violations == []
    assert amq.at_commit.settled_by_broker == [(0, Accepted())]
    assert (amq.queue.ready, amq.queue.acquired) == ((), 0)


@pytest.mark.parametrize("outcome", [Released(), Rejected(), Modified()], ids=["released", "rejected", "modified"])
def test_transactional_retirement_other_than_accepted_is_ignored(outcome: Any) -> None:
    """Quirk 5, its other half: ActiveMQ ignores a transactional ``released``, ``rejected`` or ``modified`` (AmqpSender
    delivery): no disposition, then or at the commit, and the message stays acquired by its consumer (a second
    consumer with credit gets nothing); minibroker applies it at the commit (§4.4.2) and settles the delivery."""
    mb = retire_in_txn(world("minibroker"), outcome)
    assert mb.at_commit.settled_by_broker == [(0, outcome)]
    assert mb.queue.acquired == (0 if isinstance(outcome, Rejected) else 1)  # dead-lettered, or with consumer c2

    amq = retire_in_txn(world("activemq"), outcome)
    assert amq.at_retirement.updated == amq.at_retirement.settled_by_broker == []
    assert amq.at_commit.settled_by_broker == []
    assert amq.at_commit.started == []
    assert (amq.queue.ready, amq.queue.acquired) == ((), 1)


# -- quirk 6 -------------------------------------------------------------------------------------------------------
def test_flow_txn_id_is_ignored() -> None:
    """Quirk 6: ActiveMQ ignores a flow's txn-id (AmqpSender): the transfer carries no state and the rollback leaves
    it acquired; minibroker acquires under the transaction (§4.4.3: the transfer carries
    ``transactional-state(txn-id)``) and the rollback releases it back to the queue."""
    check_flow_txn_id_ignored("activemq")
