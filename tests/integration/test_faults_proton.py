"""Fault injection against a real client (issue 16 §1): python-qpid-proton's transactional API commits, and the
broker loses the answer (``lose-outcome``: committed, the connection cut) or cuts the connection before applying
the discharge (``drop-connection``: rolled back). Either way the client hears no outcome, only its connection
failing: what it must do next depends on which, which is why a test needs both."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import Scenario, blocking_connection, queue_depth, run


class CommitOnce(Scenario, TransactionHandler):  # type: ignore[misc]
    """Declare, send one message in the transaction, commit once its provisional outcome came; note what the
    client hears of the commit and of its connection (no reconnection: the run ends when the socket does)."""

    def __init__(self, url: str, address: str) -> None:
        super().__init__(url)
        self.address = address
        self.heard: list[str] = []

    def setup(self, container: Container) -> None:
        self.conn = container.connect(self.url, reconnect=False)
        self.connections.append(self.conn)
        self._open_transports += 1
        self.sender = container.create_sender(self.conn, self.address)
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.delivery = txn.send(self.sender, Message(body="exactly-once"))
        self._commit_when_provisional(txn)

    def _commit_when_provisional(self, txn: Transaction) -> None:
        if self.delivery.remote_state == 0:
            self.after(0.01, lambda: self._commit_when_provisional(txn))
            return
        txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.heard.append("committed")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.heard.append("commit-failed")

    def on_transport_error(self, event: Any) -> None:
        self.heard.append(f"transport error: {event.transport.condition.description}")

    def on_transport_closed(self, event: Any) -> None:
        self.heard.append("connection-lost")
        self.finished = True
        self._transport_closed()

    def on_connection_error(self, event: Any) -> None:
        self.heard.append("connection-closed")


def _consume(broker: ThreadedBroker, address: str) -> list[Any]:
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver(address, credit=1)
        message = receiver.receive(timeout=5)
        receiver.accept()
        return [message.body]


@pytest.mark.parametrize(("action", "committed"), [("lose-outcome", True), ("drop-connection", False)])
def test_a_commit_whose_answer_never_comes(broker: ThreadedBroker, action: str, committed: bool) -> None:
    rule = broker.faults.add("discharge", action)
    scenario = CommitOnce(broker.url, "orders")
    run(scenario)
    # no outcome of the commit, and no close frame either: the socket just ends
    assert sorted(scenario.heard) == ["connection-lost", "transport error: connection aborted"]
    assert broker.faults.list()[0].id == rule
    assert broker.faults.list()[0].hits == 1
    stats = broker.txn_stats
    assert (stats.committed, stats.rolled_back) == ((1, 0) if committed else (0, 1))
    assert broker.transactions == []
    assert queue_depth(broker, "orders") == (1 if committed else 0)
    if committed:
        assert _consume(broker, "orders") == ["exactly-once"]  # visible to any consumer
