"""Personalities met by a real client: python-qpid-proton's transactional API against a namespace of each.

The frame-level differences are proven in ``tests/personalities``; here the reference client shows what a user's
code meets: a transaction commits and rolls back under every personality that has transactions (with the
provisional outcome each gives), RabbitMQ's refuses the coordinator, and a ``released`` given inside a
transaction is applied by the commit under ``minibroker`` but ignored under ``artemis`` (the message stays with
the consumer), as Artemis's ProtonServerSenderContext does.
"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Delivery, Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.broker.personality import names
from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import Scenario, queue_stats, run, send_messages
from tests.integration.test_transactions_proton import SendInTransactions

TRANSACTIONAL = [n for n in names() if n not in ("rabbitmq", "strict")]
TRANSACTIONAL_STATE, ACCEPTED = 0x34, 0x24


@pytest.mark.parametrize("personality", TRANSACTIONAL)
def test_a_transaction_rolls_back_then_commits_under(broker: ThreadedBroker, personality: str) -> None:
    namespace = broker.create_namespace(personality=personality)
    # a Service Bus transaction is on one entity: it sends to the second queue via the first (issue 17 item 9)
    via = "p-a" if personality == "servicebus" else None
    scenario = SendInTransactions(namespace.url, ["p-a", "p-b"], [False, True], via=via)
    run(scenario)
    assert scenario.outcomes == ["aborted", "committed"]
    provisional = ACCEPTED if personality == "servicebus" else TRANSACTIONAL_STATE
    assert scenario.provisional == [provisional] * 4
    assert [queue_stats(namespace, q) for q in ("p-a", "p-b")] == [(1, 0), (1, 0)]


class DeclareRefused(Scenario, TransactionHandler):  # type: ignore[misc]
    """Attach a coordinator (declare a transaction) and note how the broker refuses it (the coordinator link's
    events the client does not handle itself reach the transaction's handler)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.condition: str | None = None
        self.description: str | None = None

    def setup(self, container: Container) -> None:
        container.declare_transaction(self.connect(), handler=self)

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        self.condition, self.description = condition.name, condition.description
        self.finish()


def test_rabbitmq_refuses_the_coordinator_as_rabbitmq_4_does(broker: ThreadedBroker) -> None:
    scenario = DeclareRefused(broker.create_namespace(personality="rabbitmq").url)
    run(scenario)
    assert (scenario.condition, scenario.description) == ("amqp:not-implemented", "Transactions not supported")


def test_strict_refuses_a_controller_whose_source_lists_no_outcomes_as_python_qpid_proton_sends(
    broker: ThreadedBroker,
) -> None:
    """python-qpid-proton's coordinator source lists no outcomes: under ``strict`` that is a client mistake
    (§4.3: a discharge error could then only travel by detaching), refused on attach."""
    scenario = DeclareRefused(broker.create_namespace(personality="strict").url)
    run(scenario)
    assert scenario.condition == "amqp:invalid-field"
    assert "§4.3" in str(scenario.description)


class ReleaseInTransaction(Scenario, TransactionHandler):  # type: ignore[misc]
    """Receive one message, give it ``released`` inside a transaction, commit; then wait (consumer still attached)
    until the queue's (ready, acquired) counts are ``expected``."""

    def __init__(self, namespace: ThreadedBroker, expected: tuple[int, int]) -> None:
        super().__init__(namespace.url, auto_accept=False, auto_settle=False, prefetch=0)
        self.namespace = namespace
        self.expected = expected

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.receiver = container.create_receiver(self.conn, "rel")
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn: Transaction = event.transaction
        self.receiver.flow(1)

    def on_message(self, event: Any) -> None:
        self.txn.update(event.delivery, Delivery.RELEASED)
        self.txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.when(lambda: queue_stats(self.namespace, "rel") == self.expected, self.finish)

    def describe(self) -> str:
        return f"(ready, acquired) = {queue_stats(self.namespace, 'rel')}, expected {self.expected}"


@pytest.mark.parametrize(("personality", "after_commit"), [("minibroker", (1, 0)), ("artemis", (0, 1))])
def test_a_release_inside_a_transaction(
    broker: ThreadedBroker, personality: str, after_commit: tuple[int, int]
) -> None:
    """(ready, acquired) after the commit: released back to the queue (minibroker), or still held by the consumer
    (artemis ignores a transactional released)."""
    namespace = broker.create_namespace(personality=personality)
    send_messages(namespace, "rel", [Message(body="m")])
    run(ReleaseInTransaction(namespace, after_commit))
