"""Adversarial review of issue 19 at the client level: python-qpid-proton's own transactions (its encodings of
declare/discharge, now taken by the fast path, and proton's tx_recv accepts, one disposition per delivery: the
engine's one-lookup path) against the real threaded broker. AMQP 1.0 Part 4 §4.3-§4.4."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import Scenario, queue_depth, run

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "data-dir"])
def threaded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ThreadedBroker]:
    """The broker without a data dir (the commit answered at once) and with one (answered once journaled)."""
    config: dict[str, Any] = {"server": {"port": 0}}
    if request.param == "data-dir":
        config["data_dir"] = str(tmp_path)
    with run_in_thread(config) as broker:
        yield broker


class SendReceiveRollBack(Scenario, TransactionHandler):
    """txn 1 posts five messages and commits; txn 2 takes them with proton's transactional accepts and
    commits; txn 3 posts two and rolls back."""

    def __init__(self, broker: ThreadedBroker) -> None:
        super().__init__(broker.url, auto_accept=False)
        self.broker = broker
        self.steps: list[str] = []
        self.received: list[Any] = []
        self.txn: Transaction | None = None

    def setup(self, container: Container) -> None:
        self.container_ = container
        self.conn = self.connect()
        self.sender = container.create_sender(self.conn, "tq")
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.txn = txn
        step = len(self.steps)
        if step == 0:
            sent = [txn.send(self.sender, Message(body=f"m{i}", durable=i % 2 == 0)) for i in range(5)]
            self.when(lambda: all(d.remote_state != 0 for d in sent), txn.commit)
        elif step == 1:
            self.receiver = self.container_.create_receiver(self.conn, "tq", options=None)
            self.receiver.flow(5)
        else:
            sent = [txn.send(self.sender, Message(body=f"x{i}")) for i in range(2)]
            self.when(lambda: all(d.remote_state != 0 for d in sent), txn.abort)

    def on_message(self, event: Any) -> None:
        assert self.txn is not None
        self.received.append(event.message.body)
        self.txn.accept(event.delivery)
        if len(self.received) == 5:
            self.when(lambda: queue_depth(self.broker, "tq") == 0, self.txn.commit)

    def _next(self, outcome: str) -> None:
        self.steps.append(outcome)
        if len(self.steps) == 3:
            self.finish()
        else:
            self.container_.declare_transaction(self.conn, handler=self)

    def on_transaction_committed(self, event: Any) -> None:
        self._next("committed")

    def on_transaction_aborted(self, event: Any) -> None:
        self._next("aborted")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._next("commit-failed")

    def on_transaction_declare_failed(self, event: Any) -> None:
        self._next("declare-failed")


def test_proton_transactions_send_receive_and_roll_back(threaded: ThreadedBroker) -> None:
    scenario = SendReceiveRollBack(threaded)
    run(scenario)
    assert scenario.steps == ["committed", "committed", "aborted"]
    assert scenario.received == [f"m{i}" for i in range(5)]
    queue = threaded.queue("tq")
    assert (queue.depth, queue.acquired, queue.staged) == (0, 0, 0)
    stats = threaded.txn_stats
    assert (stats.declared, stats.committed, stats.rolled_back) == (3, 2, 1)
