"""Nothing a peer sends, and no bug in a broker step, ends the process (issue 12, item 1).

A message whose ``header.delivery-count`` is already 0xFFFFFFFF (the largest uint) used to overflow when a
``modified(delivery-failed)`` counted one more failure: on an ordinary disposition the consumer that sent it
lost its connection and the message was lost; inside a transaction, at the transaction's time-out, the error
escaped the timer task and ended the process. The count now saturates, and every broker step is contained:
an error in a connection's step closes that connection with ``amqp:internal-error`` (its messages go back,
its transactions roll back) and an error in a timer step is logged; either way everyone else is served.

Every test runs the real core, engine, connection tasks and timer task (``minibroker.testing.memory``) under
``MockClock(autojump_threshold=0)``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Close,
    Coordinator,
    Declare,
    Declared,
    Disposition,
    Flow,
    Header,
    MessageAnnotations,
    Modified,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.coordinator import Coordinator as TxnCoordinator
from minibroker.broker.core import BrokerSettings
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.policy import NodePolicy
from minibroker.broker.views import view_message
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

MAX_UINT = 0xFFFFFFFF
FAILED = Modified(delivery_failed=True)


def worn_out(body: str = "worn") -> bytes:
    """A message whose delivery-count is already the largest uint."""
    return frames.message(body, Header(delivery_count=UInt(MAX_UINT)))


@pytest.fixture
def settings() -> BrokerSettings:
    return BrokerSettings()


@pytest.fixture
async def mb(settings: BrokerSettings) -> AsyncIterator[MemoryBroker]:
    async with memory_broker(settings, receive_timeout=5.0) as running:
        yield running


async def client(mb: MemoryBroker, name: str) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open(container_id=name)
    await peer.begin()
    return peer


async def publish(peer: MemoryPeer, address: str, payload: bytes, *, handle: int = 0, delivery_id: int = 0) -> None:
    if delivery_id == 0:
        await peer.attach_sender(address, handle, name=f"to-{address}-{handle}")
        await peer.expect(Flow)
    await peer.transfer(handle, delivery_id, payload)
    assert isinstance((await peer.expect(Disposition)).state, Accepted)


class Got(NamedTuple):
    """A message the broker delivered: its delivery id and its bytes."""

    delivery_id: int
    payload: bytes


async def receive(peer: MemoryPeer) -> Got:
    """The next (single-frame) transfer; flows and dispositions the broker sends meanwhile are skipped."""
    while True:
        frame = await peer.receive()
        if isinstance(frame.performative, Transfer):
            return Got(frame.performative.delivery_id, frame.payload)
        assert not isinstance(frame.performative, Close), f"connection closed: {frame!r}"


async def worn_out_delivered(mb: MemoryBroker) -> tuple[MemoryPeer, MemoryPeer, Got]:
    """A producer that put a ``worn_out`` message on "orders", and a consumer (credit 2) it was delivered to."""
    producer = await client(mb, "producer")
    await publish(producer, "orders", worn_out())
    consumer = await client(mb, "consumer")
    await consumer.attach_receiver("orders", 0, name="c")
    await consumer.flow(handle=0, link_credit=2, delivery_count=0)
    return producer, consumer, await receive(consumer)


def condition(close: Close) -> str | None:
    return None if close.error is None else str(close.error.condition)


def count_of(got: Got) -> int:
    return view_message(got.payload).delivery_count


async def serves(mb: MemoryBroker, address: str = "bystander") -> None:
    """The broker still serves a new client: a message goes through a queue and back."""
    peer = await client(mb, f"probe-{address}")
    await publish(peer, address, frames.message("still here"))
    await peer.attach_receiver(address, 1, name=f"from-{address}")
    await peer.flow(handle=1, link_credit=1, delivery_count=0)
    transfer = await receive(peer)
    assert view_message(transfer.payload).body == "still here"
    await peer.disposition(transfer.delivery_id, state=Accepted())
    await peer.close()


# -- the overflow (item 1) --------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(max_delivery_attempts=0))])
async def test_modified_delivery_failed_at_the_largest_count_redelivers_it_saturated(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    _producer, consumer, first = await worn_out_delivered(mb)
    assert count_of(first) == MAX_UINT
    await consumer.disposition(first.delivery_id, state=FAILED)
    again = await receive(consumer)  # the same consumer, still connected, gets it again
    assert count_of(again) == MAX_UINT
    assert view_message(again.payload).body == "worn"
    await consumer.disposition(again.delivery_id, state=Accepted())
    await mb.settle()
    orders = mb.queue("orders").stats()
    assert (orders.depth, orders.acquired) == (0, 0)
    assert mb.broker.internal_errors == 0  # saturated: nothing had to be contained
    await serves(mb)


async def test_modified_delivery_failed_at_the_largest_count_dead_letters_it_saturated(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """With the default max_delivery_attempts (10) the message is past it: dead-lettered, not lost."""
    producer, consumer, first = await worn_out_delivered(mb)
    await consumer.disposition(first.delivery_id, state=Modified(delivery_failed=True, message_annotations={}))
    await mb.settle()
    dead = mb.queue("orders.DLQ")
    assert dead.depth == 1
    (message,) = dead.peek()
    assert message.delivery_count == MAX_UINT
    assert message.annotations["x-opt-dead-letter-reason"] == "max-delivery-attempts"
    assert mb.broker.internal_errors == 0
    # the consumer is still connected and served
    await publish(producer, "orders", frames.message("next"), delivery_id=1)
    assert view_message((await receive(consumer)).payload).body == "next"


@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(max_delivery_attempts=0))])
async def test_annotated_modified_at_the_largest_count_keeps_the_count(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    _producer, consumer, first = await worn_out_delivered(mb)
    annotated = Modified(delivery_failed=True, message_annotations={Symbol("x-why"): "because"})
    await consumer.disposition(first.delivery_id, state=annotated)
    again = view_message((await receive(consumer)).payload)
    assert (again.delivery_count, again.annotations) == (MAX_UINT, {Symbol("x-why"): "because"})
    assert mb.broker.internal_errors == 0


@pytest.mark.parametrize(
    "settings", [BrokerSettings(transaction_timeout=10, node_defaults=NodePolicy(max_delivery_attempts=0))]
)
async def test_transaction_timeout_applying_modified_at_the_largest_count_keeps_the_process(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """Taken in a transaction (its accept staged, the delivery settled), with default-outcome
    modified(delivery-failed): the time-out's rollback gives it that default outcome."""
    producer = await client(mb, "producer")
    await publish(producer, "orders", worn_out())
    consumer = await client(mb, "consumer")
    await consumer.attach_sender(
        None, 5, name="txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    await consumer.expect(Flow)
    await consumer.transfer(5, 0, frames.message(AmqpValue(Declare())))
    declared = (await consumer.expect(Disposition)).state
    assert isinstance(declared, Declared)
    source = Source(address="orders", default_outcome=FAILED, outcomes=[Symbol("amqp:modified:list")])
    await consumer.attach_receiver("orders", 0, name="c", source=source)
    await consumer.flow(handle=0, link_credit=2, delivery_count=0)
    first = await receive(consumer)
    staged = TransactionalState(txn_id=declared.txn_id, outcome=Accepted())
    await consumer.disposition(first.delivery_id, state=staged, settled=True)
    await trio.sleep(11)  # the time-out rolls back: the delivery, settled by the client, gets the default outcome
    again = await receive(consumer)
    assert count_of(again) == MAX_UINT
    assert mb.broker.txn_stats.timed_out == 1
    assert mb.broker.internal_errors == 0
    await serves(mb)


# -- containment of broker steps ----------------------------------------------------------------------------
def boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("injected fault")


async def test_error_in_a_connection_step_closes_that_connection_with_internal_error(
    mb: MemoryBroker, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the faulty connection holds an unsettled delivery: it must go back when the connection is closed
    producer = await client(mb, "producer")
    await publish(producer, "orders", frames.message("held"))
    faulty = await client(mb, "faulty")
    await faulty.attach_receiver("orders", 0, name="c")
    await faulty.flow(handle=0, link_credit=1, delivery_count=0)
    await receive(faulty)
    bystander = await client(mb, "bystander")
    await bystander.attach_receiver("other", 0, name="b")
    original = Dispatcher.publish

    def publish_or_fail(self: Dispatcher, conn: Any, delivery: Any, node: Any, message: Any) -> None:
        if b"boom" in message.payload:
            raise RuntimeError("injected fault")
        original(self, conn, delivery, node, message)

    monkeypatch.setattr(Dispatcher, "publish", publish_or_fail)
    caplog.set_level(logging.ERROR)
    await faulty.attach_sender("orders", 1, name="p")
    await faulty.expect(Flow)
    await faulty.transfer(1, 0, frames.message("boom"))
    close = await faulty.expect(Close)
    assert condition(close) == Condition.INTERNAL_ERROR
    await faulty.expect_closed()
    assert "injected fault" in caplog.text
    assert mb.broker.internal_errors == 1
    await mb.settle()
    orders = mb.queue("orders").stats()
    assert (orders.depth, orders.acquired) == (1, 0)  # the held message is back, nothing of "boom" arrived
    # the others go on: the bystander's link still works, and a new client is served
    await publish(producer, "other", frames.message("for the bystander"), handle=1)
    await bystander.flow(handle=0, link_credit=1, delivery_count=0)
    assert view_message((await receive(bystander)).payload).body == "for the bystander"
    await serves(mb)


async def test_error_in_a_connection_step_rolls_back_its_transactions(
    mb: MemoryBroker, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    faulty = await client(mb, "faulty")
    await faulty.attach_sender(
        None, 5, name="txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    await faulty.expect(Flow)
    await faulty.transfer(5, 0, frames.message(AmqpValue(Declare())))
    declared = (await faulty.expect(Disposition)).state
    await faulty.attach_sender("orders", 1, name="p")
    await faulty.expect(Flow)
    await faulty.transfer(1, 1, frames.message("staged"), state=TransactionalState(txn_id=declared.txn_id))
    await faulty.expect(Disposition)
    assert len(mb.broker.transactions) == 1
    monkeypatch.setattr(Dispatcher, "dispatch", boom)  # any later step of this connection fails
    await faulty.attach_receiver("orders", 2, name="c")
    close = await faulty.expect(Close)
    assert condition(close) == Condition.INTERNAL_ERROR
    await mb.settle()
    assert mb.broker.transactions == []
    assert mb.queue("orders").staged == 0
    assert all(c.finished for c in mb.broker.connections)
    monkeypatch.undo()
    await serves(mb)


async def test_error_in_a_timer_step_is_logged_and_the_broker_goes_on(
    mb: MemoryBroker, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await client(mb, "producer")
    delay = lambda ms: MessageAnnotations({Symbol("x-opt-delivery-delay"): ms})  # noqa: E731
    await publish(producer, "later", frames.message("first", delay(1000)))
    await publish(producer, "later", frames.message("second", delay(5000)), delivery_id=1)
    original = Dispatcher._due
    calls = []

    def due_once_failing(self: Dispatcher, entry: Any) -> None:
        calls.append(entry)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        original(self, entry)

    monkeypatch.setattr(Dispatcher, "_due", due_once_failing)
    caplog.set_level(logging.ERROR)
    await trio.sleep(2)
    assert "injected fault" in caplog.text
    await serves(mb)  # the process still serves everybody, the producer's connection included
    await publish(producer, "elsewhere", frames.message("x"), handle=1)
    await trio.sleep(4)
    assert len(calls) == 2  # the later timer still ran
    assert mb.broker.internal_errors == 1
    assert [m.body for m in mb.queue("later").peek()] == ["second"]


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)])
async def test_error_in_a_transaction_timeout_is_contained_and_not_repeated(
    mb: MemoryBroker, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    peer = await client(mb, "controller")
    await peer.attach_sender(
        None, 5, name="txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    await peer.expect(Flow)
    await peer.transfer(5, 0, frames.message(AmqpValue(Declare())))
    assert isinstance((await peer.expect(Disposition)).state, Declared)
    calls = []

    def failing_rollback(self: TxnCoordinator, txn: Any) -> Any:
        calls.append(txn)
        raise RuntimeError("injected fault")

    monkeypatch.setattr(TxnCoordinator, "_rollback", failing_rollback)
    caplog.set_level(logging.ERROR)
    await trio.sleep(30)
    assert len(calls) == 1  # logged once, the transaction forgotten: no time-out coming round for ever
    assert mb.broker.transactions == []
    assert mb.broker.coordinator.next_deadline() is None
    assert "injected fault" in caplog.text
    monkeypatch.undo()
    await serves(mb)


async def test_error_escaping_the_core_closes_only_that_connection(
    mb: MemoryBroker, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trio layer's own guard: even an error the core did not contain costs one connection."""
    from minibroker.broker.core import Broker

    faulty = await client(mb, "faulty")
    original = Broker.handle
    target = mb.tasks[-1].engine

    def handle(self: Broker, conn: Any, events: Any, now: float = 0.0) -> None:
        if conn is target and not conn.finished and conn.phase.name == "OPENED":
            raise RuntimeError("injected fault outside the core's guard")
        original(self, conn, events, now)

    monkeypatch.setattr(Broker, "handle", handle)
    await faulty.send(frames.begin(), channel=1)
    close = await faulty.expect(Close)
    assert condition(close) == Condition.INTERNAL_ERROR
    monkeypatch.undo()
    await serves(mb)


@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(max_delivery_attempts=0))])
async def test_topic_copies_each_count_their_own_failures(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """Copies share one payload, but a failure counted on one subscription is not counted on another."""
    subscribers = []
    for name in ("a", "b"):
        peer = await client(mb, name)
        attach = await peer.attach_receiver("topic://news", 0, name=name)
        assert isinstance(attach, Attach)
        await peer.flow(handle=0, link_credit=2, delivery_count=0)
        subscribers.append(peer)
    producer = await client(mb, "producer")
    await publish(producer, "topic://news", frames.message("n", Header(delivery_count=UInt(3))))
    a, b = subscribers
    got_a, got_b = await receive(a), await receive(b)
    await a.disposition(got_a.delivery_id, state=FAILED)
    assert count_of(await receive(a)) == 4
    await b.disposition(got_b.delivery_id, state=Modified(delivery_failed=False))
    assert count_of(await receive(b)) == 3


async def test_error_in_a_journal_write_is_logged_and_the_broker_goes_on(
    mb: MemoryBroker, autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class FailingSink:
        writes = 0

        def write(self) -> None:
            self.writes += 1
            raise OSError(28, "No space left on device")

    sink = FailingSink()
    mb.broker.journal_sink = sink
    caplog.set_level(logging.ERROR)
    producer = await client(mb, "producer")
    await publish(producer, "orders", frames.message("one"))  # answered: the connection is still up
    await publish(producer, "orders", frames.message("two"), delivery_id=1)
    assert sink.writes > 0
    assert "journal write failed" in caplog.text
    mb.broker.journal_sink = None
    await serves(mb)
