"""Adversarial review of issue 18 from the AMQP 1.0 side: what the RabbitMQ model and RabbitMQ 4 addresses do to
existing 1.0 behaviour (plain addresses, the idle sweep, durability through exchanges, exclusive queues), driven
with Qpid Proton's blocking client against the real broker and 0-9-1 declarations made with pika."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection, LinkDetached, SendException

import minibroker
from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(30)


@contextmanager
def amqp10(broker: ThreadedBroker) -> Iterator[BlockingConnection]:
    conn = BlockingConnection(broker.url, timeout=5)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def amqp091(broker: ThreadedBroker) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp091_url + "?socket_timeout=5"))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def send(conn: BlockingConnection, address: str, body: str, **fields: Any) -> Any:
    sender = conn.create_sender(address)
    delivery = sender.send(Message(body=body, **fields))
    sender.close()  # type: ignore[no-untyped-call]
    return delivery.remote_state


def test_a_plain_address_is_still_created_on_demand(minibroker: ThreadedBroker) -> None:
    """The default personality's plain addresses are untouched by the RabbitMQ 4 ones."""
    with amqp10(minibroker) as conn:
        assert send(conn, "plain-q", "x") == Delivery.ACCEPTED
    assert minibroker.queue("plain-q").depth == 1


def test_a_queues_address_is_never_created_on_demand(minibroker: ThreadedBroker) -> None:
    """RabbitMQ 4 (rabbit_amqp_session.erl): ``/queues/NAME`` of a missing queue is amqp:not-found."""
    with amqp10(minibroker) as conn, pytest.raises((LinkDetached, SendException)):
        send(conn, "/queues/absent", "x")


def test_a_091_declared_queue_bound_to_an_exchange_is_reached_by_a_10_sender(minibroker: ThreadedBroker) -> None:
    with amqp091(minibroker) as ch:
        ch.queue_declare("bound-q")
        ch.queue_bind("bound-q", "amq.topic", "a.*")
        with amqp10(minibroker) as conn:
            assert send(conn, "/exchanges/amq.topic/a.b", "routed") == Delivery.ACCEPTED
            with pytest.raises(SendException) as raised:  # released: routed nowhere (RabbitMQ 4)
                send(conn, "/exchanges/amq.topic/z", "unrouted")
            assert raised.value.state == Delivery.RELEASED
        method, _, body = ch.basic_get("bound-q")
    assert body is not None
    assert (method.exchange, method.routing_key) == ("amq.topic", "a.b")


def test_another_connections_exclusive_queue_is_locked_for_a_10_receiver(minibroker: ThreadedBroker) -> None:
    """RabbitMQ 4 (rabbit_amqp_session.erl attach: check_exclusive_access): amqp:resource-locked."""
    with amqp091(minibroker) as ch:
        ch.queue_declare("excl", exclusive=True)
        with amqp10(minibroker) as conn, pytest.raises(LinkDetached) as raised:
            conn.create_receiver("/queues/excl")
        assert "resource-locked" in str(raised.value)


def test_a_queue_created_on_demand_then_declared_and_bound_is_not_swept_as_idle() -> None:
    """A queue a 0-9-1 client declared (and bound) is RabbitMQ's: it lives until deleted, whoever created the node
    first; the idle sweep is for nodes created on demand and left alone."""
    config = {"server": {"port": 0}, "broker": {"clock": "virtual", "auto_delete_idle": 60}}
    with minibroker.run_in_thread(config) as broker:
        with amqp10(broker) as conn:
            conn.create_receiver("swept").close()  # type: ignore[no-untyped-call]  # created on demand
        with amqp091(broker) as ch:
            ch.queue_declare("swept")
            ch.queue_bind("swept", "amq.direct", "k")
        broker.clock.advance(200)
        with amqp10(broker) as conn:
            assert send(conn, "/exchanges/amq.direct/k", "kept") == Delivery.ACCEPTED
        assert broker.queue("swept").depth == 1


def test_a_091_declared_queue_is_not_swept_as_idle() -> None:
    config = {"server": {"port": 0}, "broker": {"clock": "virtual", "auto_delete_idle": 60}}
    with minibroker.run_in_thread(config) as broker:
        with amqp091(broker) as ch:
            ch.queue_declare("declared")
            ch.queue_bind("declared", "amq.direct", "k")
        broker.clock.advance(200)
        with amqp10(broker) as conn:
            assert send(conn, "/exchanges/amq.direct/k", "kept") == Delivery.ACCEPTED


def _serve(data_dir: Path) -> Any:
    return minibroker.run_in_thread({"server": {"port": 0}, "data_dir": str(data_dir)})


def test_a_durable_10_message_through_an_exchange_is_recovered_in_its_queue(tmp_path: Path) -> None:
    with _serve(tmp_path) as broker:
        with amqp091(broker) as ch:
            ch.queue_declare("jq", durable=True)
            ch.queue_bind("jq", "amq.fanout", "")
        with amqp10(broker) as conn:
            assert send(conn, "/exchanges/amq.fanout", "durable", durable=True) == Delivery.ACCEPTED
    with _serve(tmp_path) as broker, amqp10(broker) as conn:
        receiver = conn.create_receiver("/queues/jq")
        got = receiver.receive(timeout=5)
        receiver.accept()
    assert got.body == "durable"


@pytest.mark.parametrize("minibroker", ["minibroker", "rabbitmq"], indirect=True)
def test_a_10_post_to_a_queue_reaches_091_as_the_default_exchange_with_its_name(minibroker: ThreadedBroker) -> None:
    """rabbit_amqp_session.erl: a message to ``/queues/NAME`` is routed by the default exchange with key NAME, which a
    0-9-1 consumer reads in get-ok / deliver."""
    with amqp091(minibroker) as ch:
        ch.queue_declare("direct-q")
        with amqp10(minibroker) as conn:
            assert send(conn, "/queues/direct-q", "hello", subject="ignored") == Delivery.ACCEPTED
        method, _props, body = ch.basic_get("direct-q")
    assert body is not None
    assert (method.exchange, method.routing_key) == ("", "direct-q")
