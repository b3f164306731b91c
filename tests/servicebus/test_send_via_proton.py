"""Service Bus send-via end to end with python-qpid-proton's transactional API (issue 17 item 9): a message of
queue A completed and a new one sent via A to queue B in one transaction commit or roll back together. (The
Python and JavaScript Service Bus SDKs have no transactions; proton sends what the .NET via-sender sends.)"""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import Scenario, TransferDestination, queue_stats, run, send_messages, wait_for

pytestmark = pytest.mark.timeout(60)


class CompleteAndSendVia(Scenario, TransactionHandler):  # type: ignore[misc]
    """Take one message from ``a``; in a transaction accept it and send one via ``a`` to ``b``; commit or abort;
    then wait until (depth, acquired) of ``a`` and ``b`` are ``expected``."""

    def __init__(self, broker: ThreadedBroker, *, commit: bool, expected: list[tuple[int, int]]) -> None:
        super().__init__(broker.url, auto_accept=False, auto_settle=False, prefetch=0)
        self.broker = broker
        self.commit = commit
        self.expected = expected
        self.discharged: str | None = None

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.receiver = container.create_receiver(self.conn, "a")
        self.sender = container.create_sender(self.conn, "a", name="via", options=TransferDestination("b"))
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn: Transaction = event.transaction
        self.receiver.flow(1)

    def on_message(self, event: Any) -> None:
        self.txn.send(self.sender, Message(body="out"))
        self.txn.accept(event.delivery)
        if self.commit:
            self.txn.commit()
        else:
            self.txn.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self._discharged("committed")

    def on_transaction_aborted(self, event: Any) -> None:
        self._discharged("aborted")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._discharged("commit-failed")

    def _discharged(self, outcome: str) -> None:
        self.discharged = outcome
        self.when(lambda: self._stats() == self.expected, self.finish)

    def _stats(self) -> list[tuple[int, int]]:
        return [queue_stats(self.broker, q) for q in ("a", "b")]

    def describe(self) -> str:
        return f"{self.discharged}: (depth, acquired) of a, b = {self._stats()}, expected {self.expected}"


def test_commit_moves_the_message_from_a_to_b(sb_broker: ThreadedBroker) -> None:
    send_messages(sb_broker, "a", [Message(body="in")])
    scenario = CompleteAndSendVia(sb_broker, commit=True, expected=[(0, 0), (1, 0)])
    run(scenario)
    assert scenario.discharged == "committed"


def test_rollback_leaves_b_empty_and_the_message_with_its_consumer(sb_broker: ThreadedBroker) -> None:
    """proton leaves a transactionally accepted delivery unsettled: after the rollback the consumer still holds
    it (locked, as on Service Bus), and it is back on A once the connection is gone."""
    send_messages(sb_broker, "a", [Message(body="in")])
    scenario = CompleteAndSendVia(sb_broker, commit=False, expected=[(0, 1), (0, 0)])
    run(scenario)
    assert scenario.discharged == "aborted"
    wait_for(lambda: [queue_stats(sb_broker, q) for q in ("a", "b")] == [(1, 0), (0, 0)], "the message back on a")
