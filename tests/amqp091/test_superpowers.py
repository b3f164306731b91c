"""The test superpowers hold for AMQP 0-9-1 clients as for AMQP 1.0 ones (the gateway is an ordinary 1.0 connection
inside the broker): inspection, reset, fault injection and virtual time, driven with pika."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

import minibroker
from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(30)


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url + "?socket_timeout=5"))


@pytest.fixture
def channel(amqp091_url: str) -> Iterator[Any]:
    conn = connect(amqp091_url)
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


def test_the_connection_is_inspected_like_any_other(channel: Any, minibroker: ThreadedBroker) -> None:
    (info,) = minibroker.connections
    assert info.container_id.startswith("amqp091-")
    assert info.user == "guest"
    assert info.sessions == 1  # the channel


def test_reset_closes_a_091_connection_with_connection_forced(amqp091_url: str, minibroker: ThreadedBroker) -> None:
    conn = connect(amqp091_url)
    channel = conn.channel()
    channel.queue_declare("doomed")
    minibroker.reset()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        channel.queue_declare("after")
    assert raised.value.reply_code == 320
    assert minibroker.queues == []


def test_a_fault_rule_rejecting_transfers_nacks_a_confirmed_publish(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.confirm_delivery()
    channel.queue_declare("faulty")
    minibroker.faults.add("transfer", "reject", address="faulty", times=1)
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "faulty", b"refused")
    channel.basic_publish("", "faulty", b"taken")  # the rule fired its one time
    _method, _properties, body = channel.basic_get("faulty", auto_ack=True)
    assert body == b"taken"
    assert minibroker.faults.list()[0].hits == 1


def test_a_queue_ttl_runs_on_virtual_time() -> None:
    with minibroker.run_in_thread({"server": {"port": 0}, "broker": {"clock": "virtual"}}) as broker:
        conn = connect(broker.amqp091_url)
        try:
            channel = conn.channel()
            channel.queue_declare("perishable", arguments={"x-message-ttl": 60_000})
            channel.basic_publish("", "perishable", b"fresh")
            broker.wait_for(queue="perishable", depth=1)
            broker.clock.advance(59)
            assert broker.queue("perishable").depth == 1
            broker.clock.advance(1)  # the expiry fires before advance returns
            assert broker.queue("perishable").depth == 0
            assert channel.basic_get("perishable") == (None, None, None)
        finally:
            conn.close()


@pytest.mark.parametrize("minibroker", ["rabbitmq"], indirect=True)
def test_channel_transactions_work_in_the_rabbitmq_personality(amqp091_url: str, minibroker: ThreadedBroker) -> None:
    """RabbitMQ refuses AMQP 1.0 coordinators (the personality does too) but serves 0-9-1 channel transactions."""
    conn = connect(amqp091_url)
    try:
        channel = conn.channel()
        channel.queue_declare("txq")
        channel.tx_select()
        channel.basic_publish("", "txq", b"staged")
        channel.tx_commit()
        assert minibroker.queue("txq").depth == 1
    finally:
        conn.close()
