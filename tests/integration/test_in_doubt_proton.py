"""An idempotent producer on python-qpid-proton survives losing its connection before the commit (issue 16 §4).

It declares a transaction with the coordinator capability ``minibroker:check-back``, posts one order under it,
and its socket is cut (the transport closed under it: no AMQP close goes out) before it commits. The broker holds
the transaction in doubt. The producer reconnects with the same container-id, asks ``$txn-check`` what became of
the transaction, commits it with an outcome message, asks again to be sure, and does not send the order a second
time: the order is on the queue exactly once. A second run waits for the broker's check message instead (on the
virtual clock, moved past ``check_immunity``) and answers it; the README's example runs as written.
"""

from __future__ import annotations

from typing import Any

from proton import Data, Message, symbol
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import Scenario, blocking_connection, run
from tests.test_readme_examples import python_block

CHECK = "$txn-check"


def symbols(data: Data) -> list[str]:
    """The symbols of a terminus's capabilities (one symbol, or an array of them)."""
    data.rewind()
    if data.next() is None:
        return []
    value = data.get_object()
    return [str(s) for s in getattr(value, "elements", [value])]


class IdempotentProducer(Scenario, TransactionHandler):  # type: ignore[misc]
    """The producer; ``states`` are the answers its queries got, ``checks`` the check messages it saw, in order.
    ``wait_for_check``: it waits for the broker's check (moving the broker's virtual clock past the immunity)
    instead of asking first."""

    def __init__(self, url: str, broker: ThreadedBroker, *, wait_for_check: bool = False) -> None:
        super().__init__(url)
        self.broker = broker
        self.wait_for_check = wait_for_check
        self.checks_seen: list[dict[str, Any]] = []
        self.txn_id: bytes | None = None
        self.states: list[str] = []
        self.granted: list[str] = []
        self.sent_orders = 0
        self.cut_done = False
        self.reconnected = False

    def setup(self, container: Container) -> None:
        self.first = self.connect()
        self.orders = container.create_sender(self.first, "orders")
        container.declare_transaction(self.first, handler=self)
        # ask for check-back: the coordinator's attach is not on the wire yet
        capabilities: Data = self.first._txn_ctrl.target.capabilities
        capabilities.clear()
        capabilities.put_array(False, Data.SYMBOL)
        capabilities.enter()
        capabilities.put_symbol(symbol("amqp:local-transactions"))
        capabilities.put_symbol(symbol("minibroker:check-back"))
        capabilities.exit()

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.txn_id = bytes(txn.id)
        self.granted = symbols(self.first._txn_ctrl.remote_target.capabilities)
        txn.send(self.orders, Message(id="order-1", body="order-1"))
        self.sent_orders += 1
        self.when(lambda: self.broker.queue("orders").stats().staged == 1, self.cut)

    def cut(self) -> None:
        """The socket goes before the commit: no close, no discharge."""
        self.cut_done = True
        transport = self.first.transport
        transport.close_tail()
        transport.close_head()

    def on_transport_error(self, event: Any) -> None:
        if not self.cut_done or self.reconnected:  # the cut one reports "connection aborted": as meant
            super().on_transport_error(event)

    def on_transport_closed(self, event: Any) -> None:
        if self.cut_done and not self.reconnected:
            self.reconnected = True
            self._open_transports -= 1  # not the end of the run: the producer comes back
            self.when(lambda: [t.state for t in self.broker.transactions] == ["in-doubt"], self.reconnect)
            return
        super().on_transport_closed(event)

    def reconnect(self) -> None:
        assert self.container is not None
        self.second = self.connect()  # the same container, so the same container-id
        self.checks = self.container.create_receiver(self.second, CHECK)
        self.answers = self.container.create_sender(self.second, CHECK)
        if not self.wait_for_check:
            self.query()

    def on_link_opened(self, event: Any) -> None:
        link = event.link
        if self.wait_for_check and link.is_receiver and link.remote_source.address == CHECK:
            self.broker.clock.advance(60)  # past check_immunity: the check goes out on this link

    def query(self) -> None:
        assert self.txn_id is not None
        self.answers.send(Message(properties={"txn-id": self.txn_id.hex(), "query": True}))

    def on_rejected(self, event: Any) -> None:
        raise AssertionError(f"{CHECK} refused a message: {event.delivery.remote.condition}")

    def describe(self) -> str:
        held = [(t.state, t.posts) for t in self.broker.transactions]
        return f"cut={self.cut_done} back={self.reconnected} granted={self.granted} states={self.states} held={held}"

    def on_message(self, event: Any) -> None:
        if event.receiver.source.address != CHECK:
            return
        message = event.message
        assert bytes(message.correlation_id) == self.txn_id
        assert self.txn_id is not None
        if "check" in message.properties:  # the broker asks: the order is in doubt, commit it
            self.checks_seen.append(dict(message.properties))
            self.answers.send(Message(properties={"txn-id": self.txn_id.hex(), "outcome": "commit"}))
            self.query()
            return
        state = message.properties["state"]
        self.states.append(state)
        if state == "in-doubt":  # the broker has it: decide, without sending the order again
            self.answers.send(Message(properties={"txn-id": self.txn_id.hex(), "outcome": "commit"}))
            self.query()
        elif state == "committed":
            self.finish()
        else:  # rolled back or unknown: an idempotent producer sends the order again (not expected here)
            raise AssertionError(f"the transaction ended {state}")


def test_an_idempotent_producer_recovers_an_in_doubt_commit(broker: ThreadedBroker) -> None:
    producer = IdempotentProducer(broker.url, broker)
    run(producer)
    assert "minibroker:check-back" in producer.granted
    assert producer.states == ["in-doubt", "committed"]
    assert producer.sent_orders == 1
    assert broker.transactions == []
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("orders", credit=10)
        got = receiver.receive(timeout=5)
        receiver.accept()
        assert got.body == "order-1"
    assert broker.queue("orders").depth == 0  # exactly once
    assert broker.txn_stats.committed == 1


def test_the_producer_answers_the_check_message() -> None:
    """The same producer waits for the broker to ask: on the virtual clock, 60 s pass in no real time."""
    config = {"server": {"port": 0}, "broker": {"clock": "virtual"}}
    with run_in_thread(config) as broker:
        producer = IdempotentProducer(broker.url, broker, wait_for_check=True)
        run(producer)
        assert producer.txn_id is not None
        assert producer.checks_seen == [{"txn-id": producer.txn_id.hex(), "posts": 1, "check": 1}]
        assert producer.states == ["committed"]
        assert broker.queue("orders").depth == 1


def test_the_readme_example_commits_an_in_doubt_transaction() -> None:
    """The README's example, run as written, with the connection cut before the commit is applied (a
    ``drop-connection`` rule added first wins over the example's ``lose-outcome``): held in doubt, the query
    answers ``in-doubt`` and the example commits it; the order is there once."""
    with run_in_thread({"server": {"port": 0}, "transactions": {"orphaned": "hold"}}) as broker:
        broker.faults.add("discharge", "drop-connection")
        code = python_block("### In-doubt transactions with check-back")
        exec(compile(code, "README.md (in-doubt)", "exec"), {"url": broker.url, "broker": broker})
        assert [(r.action, r.hits) for r in broker.faults.list()] == [("drop-connection", 1), ("lose-outcome", 0)]
        assert broker.transactions == []
        assert broker.queue("orders").depth == 1  # committed by the outcome message, not sent again
        assert broker.txn_stats.committed == 1
