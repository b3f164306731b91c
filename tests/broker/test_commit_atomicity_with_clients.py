"""Commits are atomic as seen from outside: real proton clients, the real threaded broker (DESIGN §3, §4).

White-box (hence here, among the broker's own tests): a snapshot reads which messages each consumer link holds
unsettled, which the inspection API does not give (only how many), and one test breaks the coordinator's commit.

Two producers, each a python-qpid-proton ``Container`` in a thread of its own, run transactions through
proton's transactional API: declare, send ``PER_QUEUE`` messages to each of q1, q2 and q3 (application
properties ``batch`` and ``uid``), wait for the provisional outcomes, commit; ``BATCHES`` times each. A third
container consumes from the three queues (accepting each message after recording its uid). Meanwhile the
test's thread takes snapshots inside the broker's thread, each in one ``broker.call``, so one snapshot is
one instant of broker state.

What a snapshot holds, and why it can catch a commit applied in two steps: every message of a committed
batch is, at any instant, either ready on its queue, acquired by the consumer's link (on the wire or not
yet accepted), or already recorded by the consumer (the consumer records a uid *before* its accept goes
out, so a message the broker has retired is always recorded). The snapshot reads the ready and acquired
uids of q1, q2 and q3 and then, in the same call, the consumer's record. A batch committed atomically
shows all ``3 * PER_QUEUE`` uids in that union or none of them; a commit applied to q1 first and to q2 and
q3 later shows a batch on q1 that is missing from q2 and q3. ``test_checker_sees_a_commit_split_by_a_checkpoint``
proves it by breaking the broker that way (the second half of each commit runs in a trio system task,
after a checkpoint) and asserting the checker reports it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from proton import Message
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.broker.links import Dispatched
from minibroker.broker.transactions import Transaction as BrokerTransaction
from minibroker.broker.views import view_message
from minibroker.server.app import RunningBroker
from minibroker.server.connection import wake_writers
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import Scenario, run

QUEUES = ("q1", "q2", "q3")
PER_QUEUE = 5
BATCH_SIZE = PER_QUEUE * len(QUEUES)
PRODUCERS = 2
DEADLINE = 12.0  # seconds for one whole run: producers, consumer and snapshots


# -- the clients ----------------------------------------------------------------------------------------
class Producer(Scenario, TransactionHandler):
    """``batches`` transactions in a row, each posting ``PER_QUEUE`` messages to every queue, then commit."""

    timeout = DEADLINE

    def __init__(self, url: str, name: str, batches: int) -> None:
        super().__init__(url)
        self.name = name
        self.batches = batches
        self.committed: list[str] = []
        self.batch = ""

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.senders = [container.create_sender(self.conn, q) for q in QUEUES]
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.batch = f"{self.name}-{len(self.committed)}"
        self.sent = [
            txn.send(sender, Message(body=i, properties={"batch": self.batch, "uid": f"{self.batch}/{q}/{i}"}))
            for sender, q in zip(self.senders, QUEUES, strict=True)
            for i in range(PER_QUEUE)
        ]
        self._commit_when_provisional(txn)

    def _commit_when_provisional(self, txn: Transaction) -> None:
        if any(d.remote_state == 0 for d in self.sent):  # every post has its provisional outcome first
            self.after(0.002, lambda: self._commit_when_provisional(txn))
            return
        txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.committed.append(self.batch)
        if len(self.committed) == self.batches:
            self.finish()
        else:
            assert self.container is not None
            self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_commit_failed(self, event: Any) -> None:
        raise AssertionError(f"{self.name}: commit of {self.batch} failed")

    def describe(self) -> str:
        return f"{self.name} committed {len(self.committed)} of {self.batches} batches"


class Consumer(Scenario):
    """Receives from every queue until ``expected`` messages are in; records each uid before accepting."""

    timeout = DEADLINE

    def __init__(self, url: str, expected: int, record: Callable[[str], None]) -> None:
        super().__init__(url)  # auto-accept, after on_message returns
        self.expected = expected
        self.record = record
        self.received = 0

    def setup(self, container: Container) -> None:
        conn = self.connect()
        for q in QUEUES:
            container.create_receiver(conn, q)

    def on_message(self, event: Any) -> None:
        self.record(event.message.properties["uid"])
        self.received += 1
        if self.received == self.expected:
            self.finish()

    def describe(self) -> str:
        return f"consumer received {self.received} of {self.expected}"


# -- snapshots ------------------------------------------------------------------------------------------
@dataclass
class Report:
    """What the snapshots saw."""

    snapshots: int = 0
    in_flight: int = 0
    """Snapshots in which some batch was visible and not yet wholly consumed."""
    violations: list[str] = field(default_factory=list)


class Checker:
    """Takes snapshots in the broker's thread and checks that every batch is visible wholly or not at all."""

    def __init__(self, broker: ThreadedBroker) -> None:
        self.broker = broker
        self.consumed: set[str] = set()
        self.lock = threading.Lock()
        self.report = Report()

    def record(self, uid: str) -> None:
        """The consumer received ``uid`` (called before it accepts the message)."""
        with self.lock:
            self.consumed.add(uid)

    def _read(self, running: RunningBroker) -> tuple[tuple[int, ...], dict[str, set[str]], set[str]]:
        """In the broker thread, in one go: depths, ready and acquired uids by queue, the consumer's record."""
        depths = tuple(running.queue(q).depth for q in QUEUES)
        held = {q: _held_uids(running, q) for q in QUEUES}
        with self.lock:  # after the broker's state: whatever the broker retired is recorded already
            consumed = set(self.consumed)
        return depths, held, consumed

    def snapshot(self) -> None:
        depths, held, consumed = self.broker.call(self._read)
        report = self.report
        report.snapshots += 1
        visible: dict[str, Counter[str]] = {}  # batch -> uids visible per queue
        for q in QUEUES:
            for uid in held[q] | {u for u in consumed if u.split("/")[1] == q}:
                visible.setdefault(uid.split("/")[0], Counter())[q] += 1
        pending = {uid.split("/")[0] for q in QUEUES for uid in held[q]}
        if pending:
            report.in_flight += 1
        for batch, counts in visible.items():
            if any(counts[q] != PER_QUEUE for q in QUEUES):
                report.violations.append(
                    f"snapshot {report.snapshots}: batch {batch} visible as {dict(counts)} (depths {depths})"
                )


def _held_uids(running: RunningBroker, name: str) -> set[str]:
    """uids of the messages queue ``name`` holds: ready, or acquired by a consumer link and not settled.

    Which messages a consumer holds is not in the inspection API (only how many): read from the core.
    """
    ready = [m.properties["uid"] for m in running.queue(name).peek()]
    queue = running.broker.queues.get(name)
    if queue is None:
        return set()
    acquired = [
        view_message(d.message.payload).properties["uid"]
        for consumer in running.broker.dispatcher.consumers(queue)
        for d in consumer.unsettled.values()
        if isinstance(d, Dispatched)
    ]
    return {str(uid) for uid in ready + acquired}


def run_batches(broker: ThreadedBroker, batches: int) -> Report:
    """Producers, consumer and snapshots at once; returns what the snapshots saw."""
    checker = Checker(broker)
    expected = PRODUCERS * batches * BATCH_SIZE
    producers = [Producer(broker.url, f"p{n}", batches) for n in range(PRODUCERS)]
    consumer = Consumer(broker.url, expected, checker.record)
    failures: list[BaseException] = []

    def in_thread(scenario: Scenario) -> threading.Thread:
        def target() -> None:
            try:
                run(scenario)
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=target, name=type(scenario).__name__, daemon=True)
        thread.start()
        return thread

    threads = [in_thread(consumer)] + [in_thread(p) for p in producers]
    deadline = time.monotonic() + DEADLINE + 2
    while any(t.is_alive() for t in threads):
        assert time.monotonic() < deadline, "the clients did not finish in time"
        checker.snapshot()
    for thread in threads:
        thread.join(1)
    if failures:
        raise failures[0]
    checker.snapshot()
    assert [len(p.committed) for p in producers] == [batches] * PRODUCERS
    assert len(checker.consumed) == expected
    return checker.report


@pytest.fixture
def threaded_broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as broker:
        yield broker


def _settled_down(broker: ThreadedBroker) -> bool:
    def read(running: RunningBroker) -> bool:
        queues = [running.queue(q).stats() for q in QUEUES]
        return not running.broker.transactions and all((q.depth, q.acquired, q.staged) == (0, 0, 0) for q in queues)

    return broker.call(read)


# -- the tests ------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_concurrent_commits_are_seen_whole(threaded_broker: ThreadedBroker) -> None:
    report = run_batches(threaded_broker, batches=20)
    assert report.violations == []
    assert report.snapshots >= 20, f"only {report.snapshots} snapshots were taken while the clients ran"
    threaded_broker.wait_for(lambda: _settled_down(threaded_broker), timeout=5)


@pytest.mark.timeout(30)
def test_checker_sees_a_commit_split_by_a_checkpoint(threaded_broker: ThreadedBroker) -> None:
    """Break atomicity on purpose: commit q1's share of each transaction at once and the rest after a
    trio checkpoint (in a system task, a few milliseconds later). The checker must report it."""
    errors: list[BaseException] = []

    def break_commits(running: RunningBroker) -> None:
        broker = running.broker
        coordinator = broker.coordinator
        commit = type(coordinator)._commit

        def split_commit(txn: Any) -> Any:
            now = [post for post in txn.posts if post.address == QUEUES[0]]
            rest = BrokerTransaction(txn.id + b"-rest", txn.conn, txn.controller, txn.created)
            rest.posts = [post for post in txn.posts if post.address != QUEUES[0]]
            txn.posts = now
            result = commit(coordinator, txn)  # the rest stays staged meanwhile (``queue.staged`` counts it)

            async def later() -> None:
                try:
                    await trio.sleep(0.02)
                    coordinator._open[rest] = None  # only now: the producer may have closed its connection
                    commit(coordinator, rest)
                    wake_writers(broker)
                except BaseException as exc:  # a failing system task would crash the broker's loop
                    errors.append(exc)

            trio.lowlevel.spawn_system_task(later)
            return result

        coordinator._commit = split_commit  # type: ignore[method-assign]

    threaded_broker.call(break_commits)
    report = run_batches(threaded_broker, batches=5)
    assert errors == []
    assert report.violations, f"the checker missed {PRODUCERS * 5} split commits in {report.snapshots} snapshots"
