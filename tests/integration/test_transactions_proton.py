"""Transactions through python-qpid-proton's own transactional API (Part 4 via a real client).

``Container.declare_transaction``, ``Transaction.send``, ``Transaction.accept``, ``commit`` and ``abort``
against the real broker: commits and rollbacks of sends to several queues, transactional accept then
commit and then rollback, many transactions in a row, two open at once on one session, one used from two
sessions, and a connection closed with a transaction open.
"""

from __future__ import annotations

from typing import Any

from proton import Delivery, Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.server.app import RunningBroker
from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import (
    Scenario,
    TransferDestination,
    blocking_connection,
    queue_stats,
    run,
    send_messages,
    wait_for,
)


def _stats(broker: ThreadedBroker) -> Any:
    return broker.call(lambda running: running.broker.txn_stats)


def _open_transactions(broker: ThreadedBroker) -> int:
    return broker.call(lambda running: len(running.broker.transactions))


def _bodies(broker: ThreadedBroker, address: str, count: int) -> list[Any]:
    """Consume ``count`` messages from ``address`` (accepting them) and return their bodies."""
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver(address, credit=count)
        bodies = []
        for _ in range(count):
            bodies.append(receiver.receive(timeout=5).body)
            receiver.accept()
        return bodies


class SendInTransactions(Scenario, TransactionHandler):  # type: ignore[misc]
    """Declares ``len(plan)`` transactions one after another on one connection; in each, sends one message
    to every queue of ``queues`` and then commits or aborts as ``plan`` says."""

    def __init__(self, url: str, queues: list[str], plan: list[bool], via: str | None = None) -> None:
        super().__init__(url)
        self.queues = queues
        self.via = via
        """Send to every queue but the first through this one (Service Bus send-via: ``TransferDestination``)."""
        self.plan = list(plan)
        self.outcomes: list[str] = []
        self.provisional: list[Any] = []
        self.number = 0

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.senders = [
            container.create_sender(self.conn, self.via, name=f"via-{q}", options=TransferDestination(q))
            if self.via not in (None, q)
            else container.create_sender(self.conn, q)
            for q in self.queues
        ]
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.number += 1
        self.sent = [txn.send(s, Message(body=f"txn{self.number}-{s.target.address}")) for s in self.senders]
        self._discharge_when_provisional(txn)

    def _discharge_when_provisional(self, txn: Transaction) -> None:
        if any(d.remote_state == 0 for d in self.sent):  # wait for every provisional outcome
            self.after(0.01, lambda: self._discharge_when_provisional(txn))
            return
        self.provisional.extend(d.remote_state for d in self.sent)
        if self.plan.pop(0):
            txn.commit()
        else:
            txn.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self._next("committed")

    def on_transaction_aborted(self, event: Any) -> None:
        self._next("aborted")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._next("commit-failed")

    def _next(self, outcome: str) -> None:
        self.outcomes.append(outcome)
        if self.plan:
            assert self.container is not None
            self.container.declare_transaction(self.conn, handler=self)
        else:
            self.finish()


def test_commit_and_rollback_of_sends_to_several_queues(broker: ThreadedBroker) -> None:
    queues = ["txn-a", "txn-b", "txn-c"]
    scenario = SendInTransactions(broker.url, queues, [False, True])
    run(scenario)
    assert scenario.outcomes == ["aborted", "committed"]
    # the provisional outcome of a transactional post is transactional-state (0x34) with accepted inside
    assert scenario.provisional == [0x34] * 6
    for q in queues:
        assert queue_stats(broker, q) == (1, 0)
        assert _bodies(broker, q, 1) == [f"txn2-{q}"]
    stats = _stats(broker)
    assert (stats.declared, stats.committed, stats.rolled_back) == (2, 1, 1)
    assert _open_transactions(broker) == 0


def test_many_transactions_in_a_row_on_one_connection(broker: ThreadedBroker) -> None:
    plan = [i % 3 != 0 for i in range(30)]
    scenario = SendInTransactions(broker.url, ["many"], plan)
    run(scenario)
    assert scenario.outcomes == ["committed" if p else "aborted" for p in plan]
    committed = [f"txn{i + 1}-many" for i, p in enumerate(plan) if p]
    assert _bodies(broker, "many", len(committed)) == committed
    assert queue_stats(broker, "many") == (0, 0)
    assert _open_transactions(broker) == 0


class AcceptInTransaction(Scenario, TransactionHandler):  # type: ignore[misc]
    """Receives ``count`` messages, accepts them inside a transaction, then commits or aborts."""

    def __init__(self, url: str, address: str, count: int, commit: bool) -> None:
        super().__init__(url, auto_accept=False, prefetch=0)
        self.address = address
        self.count = count
        self.commit = commit
        self.received: list[Any] = []
        self.outcome = ""

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.receiver = container.create_receiver(self.conn, self.address)
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn: Transaction = event.transaction
        self.receiver.flow(self.count)

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)
        self.txn.accept(event.delivery)
        if len(self.received) == self.count:
            self._check_then_discharge()  # the accepts go out before the discharge, on the same connection

    def _check_then_discharge(self) -> None:
        if self.commit:
            self.txn.commit()
        else:
            self.txn.abort()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.finish()

    def on_transaction_aborted(self, event: Any) -> None:
        self.outcome = "aborted"
        self.finish()


def test_transactional_accept_then_commit_removes_messages(broker: ThreadedBroker) -> None:
    send_messages(broker, "acks", [Message(body=i) for i in range(5)])
    scenario = AcceptInTransaction(broker.url, "acks", 5, commit=True)
    run(scenario)
    assert scenario.received == [0, 1, 2, 3, 4]
    assert scenario.outcome == "committed"
    assert queue_stats(broker, "acks") == (0, 0)


def test_transactional_accept_then_rollback_returns_messages(broker: ThreadedBroker) -> None:
    send_messages(broker, "acks", [Message(body=i) for i in range(3)])
    scenario = AcceptInTransaction(broker.url, "acks", 3, commit=False)
    run(scenario)
    assert scenario.outcome == "aborted"
    # proton settles its pending deliveries after the abort without an outcome of its own, so the
    # source's default outcome (released) applies: all three are back, in order, for the next consumer
    wait_for(lambda: queue_stats(broker, "acks") == (3, 0), "messages back on the queue")
    assert _bodies(broker, "acks", 3) == [0, 1, 2]
    assert _open_transactions(broker) == 0


class TwoAtOnce(Scenario, TransactionHandler):  # type: ignore[misc]
    """Two transactions open at the same time on one session: one commits, the other aborts."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.declared: list[Transaction] = []
        self.outcomes: dict[str, str] = {}
        self.open_seen = 0

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.sender = container.create_sender(self.conn, "both")
        container.declare_transaction(self.conn, handler=self)
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.declared.append(event.transaction)
        if len(self.declared) < 2:
            return
        first, second = self.declared
        assert first.id != second.id
        first.send(self.sender, Message(body="kept"))
        second.send(self.sender, Message(body="dropped"))
        self._discharge()

    def _discharge(self) -> None:
        first, second = self.declared
        second.abort()
        first.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcomes["commit"] = "committed"
        self._maybe_finish()

    def on_transaction_aborted(self, event: Any) -> None:
        self.outcomes["abort"] = "aborted"
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if len(self.outcomes) == 2:
            self.finish()


def test_two_open_transactions_on_one_session(broker: ThreadedBroker) -> None:
    scenario = TwoAtOnce(broker.url)
    run(scenario)
    assert scenario.outcomes == {"commit": "committed", "abort": "aborted"}
    assert _bodies(broker, "both", 1) == ["kept"]
    assert queue_stats(broker, "both") == (0, 0)


class TwoSessions(Scenario, TransactionHandler):  # type: ignore[misc]
    """One transaction used by senders on two different sessions of the connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.outcome = ""

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.senders = []
        for address in ("s1", "s2"):
            session = self.conn.session()
            session.open()
            sender = session.sender(f"sender-{address}")
            sender.target.address = address
            sender.open()
            self.senders.append(sender)
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        assert self.senders[0].session != self.senders[1].session
        for sender in self.senders:
            txn.send(sender, Message(body=f"via-{sender.target.address}"))
        txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.finish()


def test_one_transaction_from_two_sessions(broker: ThreadedBroker) -> None:
    scenario = TwoSessions(broker.url)
    run(scenario)
    assert scenario.outcome == "committed"
    assert _bodies(broker, "s1", 1) == ["via-s1"]
    assert _bodies(broker, "s2", 1) == ["via-s2"]


class LeaveOpen(Scenario, TransactionHandler):  # type: ignore[misc]
    """Declares a transaction, posts and accepts in it, then closes the connection without discharging."""

    def __init__(self, url: str, seen: list[int]) -> None:
        super().__init__(url, auto_accept=False)
        self.seen = seen

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.sender = container.create_sender(self.conn, "open-posts")
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.txn: Transaction = event.transaction
        self.txn.send(self.sender, Message(body="never"))
        assert self.container is not None
        self.container.create_receiver(self.conn, "open-acks")

    def on_message(self, event: Any) -> None:
        self.txn.accept(event.delivery)
        self.finish()  # the accept goes out before the close: the connection ends with the transaction open


def test_connection_closed_with_open_transaction_rolls_back(broker: ThreadedBroker) -> None:
    send_messages(broker, "open-acks", [Message(body="keep-me")])
    run(LeaveOpen(broker.url, []))
    wait_for(lambda: _open_transactions(broker) == 0, "the transaction to roll back")
    assert queue_stats(broker, "open-posts") == (0, 0)
    assert queue_stats(broker, "open-acks") == (1, 0)
    assert _bodies(broker, "open-acks", 1) == ["keep-me"]
    assert _stats(broker).rolled_back == 1


def test_transactions_are_visible_while_open(broker: ThreadedBroker) -> None:
    """broker.transactions lists an open transaction with its connection, age and staged posts."""

    class Hold(Scenario, TransactionHandler):  # type: ignore[misc]
        def setup(self, container: Container) -> None:
            self.conn = self.connect()
            self.sender = container.create_sender(self.conn, "visible")
            container.declare_transaction(self.conn, handler=self)

        def on_transaction_declared(self, event: Any) -> None:
            self.txn = event.transaction
            self.delivery: Delivery = self.txn.send(self.sender, Message(body="staged"))

        def on_settled(self, event: Any) -> None:
            if event.delivery == self.delivery:  # the broker's provisional outcome: the post is staged
                self.inspect()

        def inspect(self) -> None:
            def read(running: RunningBroker) -> Any:
                return running.broker.transactions, running.queue("visible").staged

            (txn_info,), staged = broker.call(read)
            assert txn_info.posts == 1
            assert txn_info.staged_addresses == ("visible",)
            assert txn_info.connection == self.conn.container
            assert staged == 1
            assert queue_stats(broker, "visible") == (0, 0)  # invisible to depth until commit
            self.txn.commit()

        def on_transaction_committed(self, event: Any) -> None:
            self.finish()

    run(Hold(broker.url))
    assert queue_stats(broker, "visible") == (1, 0)
    assert broker.queue("visible").staged == 0
