"""One broker, two protocols: python-qpid-proton (AMQP 1.0) and pika (AMQP 0-9-1) on the same queues.

What a 1.0 client sends, a 0-9-1 consumer receives converted as ``gateway091/convert.py``'s docstring says
(RabbitMQ 4's mapping, its "AMQP 0.9.1 <-> AMQP 1.0 conversions" page), and the other way round; RabbitMQ 4
addresses (``/exchanges/amq.topic/KEY``) route a 1.0 publish through the bindings a 0-9-1 client made; a 0-9-1
publish is acquired by a 1.0 receiver in a transaction; a channel transaction is atomic to every other
connection and rolled back when its channel closes or its connection is lost; a persistent message on a durable
queue is confirmed once it is in the journal and survives a restart.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from proton import Delivery, Message, symbol
from proton.utils import BlockingConnection as ProtonConnection
from proton.utils import LinkDetached, SendException

from minibroker.store.journal import record_offsets
from minibroker.store.records import Kind
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import BLOCKING_TIMEOUT, blocking_connection, run
from tests.integration.test_transactions_proton import AcceptInTransaction
from tests.store.test_journal_faults import Disk

pytestmark = pytest.mark.timeout(30)
QUIET = 0.3
"""How long a receiver listens for something that must not arrive."""


@contextmanager
def pika_connection(broker: ThreadedBroker) -> Iterator[pika.BlockingConnection]:
    params = pika.URLParameters(broker.amqp091_url + "?socket_timeout=5&blocked_connection_timeout=5")
    conn = pika.BlockingConnection(params)
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def channel(broker: ThreadedBroker) -> Iterator[Any]:
    with pika_connection(broker) as conn:
        yield conn.channel()


@pytest.fixture
def proton(broker: ThreadedBroker) -> Iterator[ProtonConnection]:
    with blocking_connection(broker) as conn:
        yield conn


def get(channel: Any, queue: str) -> tuple[Any, Any, bytes]:
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None, f"nothing on {queue}"
    return method, properties, body


def not_received(receiver: Any) -> bool:
    try:
        receiver.receive(timeout=QUIET)
    except Exception:  # proton.Timeout: nothing came
        return True
    return False


# -- 1.0 -> 0-9-1 ------------------------------------------------------------------------------------------------
def test_a_proton_message_as_pika_sees_it(channel: Any, proton: ProtonConnection) -> None:
    channel.queue_declare("to091")
    sender = proton.create_sender("/queues/to091")
    message = Message(
        body=b"\x00binary\xff",
        inferred=True,  # a data section
        id="m-1",
        correlation_id="c-1",
        reply_to="/queues/replies",
        content_type="application/octet-stream",
        content_encoding="gzip",
        group_id="app",
        durable=True,
        priority=7,
        ttl=60.0,
        creation_time=1_700_000_000.0,
        properties={"kind": "order", "n": 7, "ok": True},
        annotations={symbol("x-custom"): "a"},
    )
    assert sender.send(message).remote_state == Delivery.ACCEPTED
    assert sender.send(Message(body="text")).remote_state == Delivery.ACCEPTED  # an amqp-value

    method, props, body = get(channel, "to091")
    assert body == b"\x00binary\xff"
    assert (method.exchange, method.routing_key, method.redelivered) == ("", "to091", False)
    assert (props.message_id, props.correlation_id, props.reply_to) == ("m-1", "c-1", "replies")
    assert (props.content_type, props.content_encoding, props.app_id) == ("application/octet-stream", "gzip", "app")
    assert (props.delivery_mode, props.priority, props.expiration) == (2, 7, "60000")
    assert props.timestamp == 1_700_000_000
    assert props.headers == {"kind": "order", "n": 7, "ok": True, "x-custom": "a"}
    assert props.type is None

    _method, props, body = get(channel, "to091")
    # a body that is no data section: its encoded 1.0 sections, typed amqp-1.0 (RabbitMQ's mc_amqpl)
    assert props.type == "amqp-1.0"
    assert body == bytes(Message(body="text").encode())[-len(body) :]
    decoded = Message()
    decoded.decode(body)
    assert decoded.body == "text"
    assert props.delivery_mode in (None, 1)


def test_a_proton_send_to_an_exchange_address_reaches_a_pika_binding(channel: Any, proton: ProtonConnection) -> None:
    channel.queue_declare("ab")
    channel.queue_bind("ab", "amq.topic", "a.*")
    routed = proton.create_sender("/exchanges/amq.topic/a.b")
    assert routed.send(Message(body=b"routed", inferred=True)).remote_state == Delivery.ACCEPTED
    unrouted = proton.create_sender("/exchanges/amq.topic/b.a")
    with pytest.raises(SendException) as raised:  # routed nowhere: released (RabbitMQ 4)
        unrouted.send(Message(body=b"nowhere", inferred=True))
    assert raised.value.state == Delivery.RELEASED
    method, _props, body = get(channel, "ab")
    assert (body, method.exchange, method.routing_key) == (b"routed", "amq.topic", "a.b")
    assert channel.basic_get("ab") == (None, None, None)


def test_a_send_to_a_missing_exchange_is_not_found(proton: ProtonConnection) -> None:
    with pytest.raises(LinkDetached) as raised:
        proton.create_sender("/exchanges/no-such-exchange/k")
    assert "amqp:not-found" in str(raised.value)


def test_a_big_message_crosses_both_ways(channel: Any, proton: ProtonConnection) -> None:
    """Bodies larger than a 0-9-1 frame (131072) and a 1.0 frame: many body frames one way, a multi-transfer
    delivery the other, the bytes intact."""
    big = bytes(range(256)) * 2048 + b"end"  # 512 KiB and a bit
    channel.queue_declare("big")
    sender = proton.create_sender("/queues/big")
    assert sender.send(Message(body=big, inferred=True)).remote_state == Delivery.ACCEPTED
    assert get(channel, "big")[2] == big
    channel.confirm_delivery()
    channel.basic_publish("", "big", big[::-1], pika.BasicProperties(message_id="reversed"))
    receiver = proton.create_receiver("/queues/big")
    message = receiver.receive(timeout=BLOCKING_TIMEOUT)
    assert (message.id, bytes(message.body)) == ("reversed", big[::-1])
    receiver.accept()


def test_a_proton_consumer_sees_where_a_proton_publish_was_routed(channel: Any, proton: ProtonConnection) -> None:
    """RabbitMQ 4 annotates what it routes through an exchange with ``x-exchange`` and ``x-routing-key``."""
    channel.queue_declare("seen")
    channel.queue_bind("seen", "amq.direct", "k")
    sender = proton.create_sender("/exchanges/amq.direct/k")
    assert sender.send(Message(body="x", id="routed")).remote_state == Delivery.ACCEPTED
    receiver = proton.create_receiver("/queues/seen")
    message = receiver.receive(timeout=BLOCKING_TIMEOUT)
    receiver.accept()
    annotations = {str(k): v for k, v in (message.annotations or {}).items()}
    assert (message.id, message.body) == ("routed", "x")
    assert (annotations["x-exchange"], annotations["x-routing-key"]) == ("amq.direct", "k")


def test_another_connections_exclusive_queue_is_locked_to_a_proton_receiver(
    channel: Any, proton: ProtonConnection
) -> None:
    name = channel.queue_declare("", exclusive=True).method.queue
    with pytest.raises(LinkDetached) as raised:
        proton.create_receiver(f"/queues/{name}")
    assert "amqp:resource-locked" in str(raised.value)


# -- 0-9-1 -> 1.0 ------------------------------------------------------------------------------------------------
def test_a_pika_message_as_proton_sees_it(channel: Any, proton: ProtonConnection) -> None:
    channel.queue_declare("to10")
    properties = pika.BasicProperties(
        content_type="text/plain",
        content_encoding="utf-8",
        headers={"kind": "order", "n": 7, "x-custom": "a"},
        delivery_mode=2,
        priority=4,
        correlation_id="c-1",
        reply_to="replies",
        expiration="60000",
        message_id="m-1",
        timestamp=1_700_000_000,
        type="order.created",
        app_id="app",
    )
    channel.confirm_delivery()
    channel.basic_publish("", "to10", b"hello", properties)
    receiver = proton.create_receiver("/queues/to10")
    message = receiver.receive(timeout=BLOCKING_TIMEOUT)
    receiver.accept()
    assert bytes(message.body) == b"hello"
    assert (message.id, message.correlation_id, message.reply_to) == ("m-1", "c-1", "/queues/replies")
    assert (message.content_type, message.content_encoding, message.group_id) == ("text/plain", "utf-8", "app")
    assert (message.durable, message.priority, message.ttl) == (True, 4, 60.0)
    assert message.creation_time == 1_700_000_000.0
    assert message.properties == {"kind": "order", "n": 7}
    annotations = {str(k): v for k, v in (message.annotations or {}).items()}
    assert annotations["x-custom"] == "a"
    assert annotations["x-basic-type"] == "order.created"
    assert (annotations["x-exchange"], annotations["x-routing-key"]) == ("", "to10")


class AcceptIdsInTransaction(AcceptInTransaction):
    """``AcceptInTransaction`` keeping the message-ids (proton hands a data section out as a memoryview over a
    buffer it reuses for the next message)."""

    def __init__(self, url: str, address: str, count: int, commit: bool) -> None:
        super().__init__(url, address, count, commit)
        self.ids: list[str] = []

    def on_message(self, event: Any) -> None:
        self.ids.append(event.message.id)
        super().on_message(event)


def test_a_proton_receiver_in_a_transaction_acquires_what_pika_published(channel: Any, broker: ThreadedBroker) -> None:
    channel.queue_declare("acq")
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", "acq", b"body", pika.BasicProperties(message_id=str(n)))

    aborted = AcceptIdsInTransaction(broker.url, "acq", 3, commit=False)
    run(aborted)
    assert (aborted.outcome, aborted.ids) == ("aborted", ["0", "1", "2"])
    broker.wait_for(queue="acq", depth=3)  # rolled back: all back

    committed = AcceptIdsInTransaction(broker.url, "acq", 3, commit=True)
    run(committed)
    assert (committed.outcome, committed.ids) == ("committed", ["0", "1", "2"])
    assert broker.queue("acq").depth == 0
    assert channel.basic_get("acq") == (None, None, None)


# -- channel transactions seen from other connections ------------------------------------------------------------
def test_a_channel_transaction_is_atomic_to_other_consumers(
    channel: Any, broker: ThreadedBroker, proton: ProtonConnection
) -> None:
    channel.queue_declare("atomic")
    receiver = proton.create_receiver("/queues/atomic", credit=20)
    with pika_connection(broker) as other:
        watcher = other.channel()
        channel.tx_select()
        for n in range(10):
            channel.basic_publish("", "atomic", b"body", pika.BasicProperties(message_id=str(n)))
        channel.queue_declare("atomic", passive=True)  # a round trip: the publishes are in, staged
        assert not_received(receiver)
        assert watcher.basic_get("atomic") == (None, None, None)
        assert len(broker.transactions) == 1
        channel.tx_commit()
        ids = []
        for _ in range(10):
            ids.append(receiver.receive(timeout=BLOCKING_TIMEOUT).id)
            receiver.accept()
        assert ids == [str(n) for n in range(10)]
        assert not_received(receiver)


def test_closing_the_channel_rolls_back_publishes_and_acks(broker: ThreadedBroker) -> None:
    with pika_connection(broker) as conn:
        setup = conn.channel()
        setup.queue_declare("txc")
        setup.confirm_delivery()
        setup.basic_publish("", "txc", b"held")
        channel = conn.channel()
        channel.tx_select()
        method, _props, _body = channel.basic_get("txc", auto_ack=False)
        channel.basic_ack(method.delivery_tag)
        channel.basic_publish("", "txc", b"never")
        channel.queue_declare("txc", passive=True)
        assert len(broker.transactions) == 1
        channel.close()
        broker.wait_for(transactions=0)
        broker.wait_for(queue="txc", depth=1)  # the acked message is back, the publish gone
        method, _props, body = setup.basic_get("txc", auto_ack=True)
        assert (body, method.redelivered) == (b"held", True)
        assert setup.basic_get("txc") == (None, None, None)


def test_a_lost_connection_rolls_its_transaction_back(broker: ThreadedBroker) -> None:
    with pika_connection(broker) as conn:
        setup = conn.channel()
        setup.queue_declare("txl")
        setup.confirm_delivery()
        setup.basic_publish("", "txl", b"held")
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp091_url + "?socket_timeout=5"))
    channel = conn.channel()
    channel.tx_select()
    method, _props, _body = channel.basic_get("txl", auto_ack=False)
    channel.basic_ack(method.delivery_tag)
    for n in range(5):
        channel.basic_publish("", "txl", b"%d" % n)
    channel.queue_declare("txl", passive=True)
    assert len(broker.transactions) == 1
    assert broker.queue("txl").depth == 0
    sock: socket.socket = conn._impl._transport._sock  # the socket under pika's connection: cut it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(pika.exceptions.AMQPError):  # pika sees its socket end
        conn.process_data_events(time_limit=5)
    broker.wait_for(transactions=0)
    broker.wait_for(queue="txl", depth=1)
    with pika_connection(broker) as again:
        method, _props, body = get(again.channel(), "txl")
        assert (body, method.redelivered) == (b"held", True)
        assert broker.queue("txl").depth == 0


# -- durability --------------------------------------------------------------------------------------------------
def enqueued(data_dir: Path) -> int:
    """ENQUEUE records written to the journal's segments so far."""
    kinds = (Kind.ENQUEUE, Kind.ENQUEUE_REF, Kind.TXN)
    return sum(
        1 for segment in sorted(data_dir.glob("journal-*.log")) for *_, kind in record_offsets(segment) if kind in kinds
    )


def test_persistent_messages_are_confirmed_once_journaled_and_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    config = {"server": {"port": 0}, "data_dir": str(data_dir)}
    with run_in_thread(config) as broker, pika_connection(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("kept", durable=True)
        channel.confirm_delivery()
        before = enqueued(data_dir)
        for n in range(5):
            channel.basic_publish("", "kept", b"%d" % n, pika.BasicProperties(delivery_mode=2))  # returns on the ack
            assert enqueued(data_dir) == before + n + 1, "confirmed before the journal had it"
        channel.basic_publish("", "kept", b"transient", pika.BasicProperties(delivery_mode=1))
        assert enqueued(data_dir) == before + 5  # not persistent: not journaled
        marker = uuid.uuid4().hex.encode()
        channel.basic_publish("", "kept", marker, pika.BasicProperties(delivery_mode=2, headers={"h": 1}))
    with run_in_thread(config) as broker, pika_connection(broker) as conn:
        channel = conn.channel()
        assert channel.queue_declare("kept", passive=True).method.message_count == 6
        bodies = []
        while (got := channel.basic_get("kept", auto_ack=True))[0] is not None:
            bodies.append(got[2])
            last = got[1]
        assert bodies == [b"0", b"1", b"2", b"3", b"4", marker]
        assert (last.delivery_mode, last.headers) == (2, {"h": 1})


def test_a_persistent_publish_the_journal_cannot_write_is_nacked(tmp_path: Path) -> None:
    """A confirm waits for the journal: with the disk full, a persistent message to a durable queue is refused
    (``amqp:resource-limit-exceeded`` inside) and the publisher gets basic.nack, never an ack; a transient one is
    still acked."""
    config = {"server": {"port": 0}, "data_dir": str(tmp_path / "data")}
    disk = Disk()
    with run_in_thread(config) as broker, pika_connection(broker) as conn:
        channel = conn.channel()
        channel.queue_declare("kept", durable=True)
        channel.confirm_delivery()
        channel.basic_publish("", "kept", b"written", pika.BasicProperties(delivery_mode=2))

        def full(running: Any) -> None:
            running._server.journal.ops = disk

        disk.room = 0
        broker.call(full)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "kept", b"refused", pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", "kept", b"transient", pika.BasicProperties(delivery_mode=1))
        assert [get(channel, "kept")[2] for _ in range(2)] == [b"written", b"transient"]
