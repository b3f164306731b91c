"""AMQP 0-9-1 clients on the AMQP port, driven with pika's blocking adapter (pika 1.x, a client written by someone
else): publish/consume/ack/nack/reject, basic.get, every exchange type, publisher confirms, channel transactions,
and the channel errors RabbitMQ gives, against the real broker in a thread (one namespace per test)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(30)


def url_of(broker: ThreadedBroker, vhost: str = "%2F") -> str:
    return f"amqp://guest:guest@{broker.host}:{broker.port}/{vhost}"


@pytest.fixture
def connection(minibroker: ThreadedBroker) -> Iterator[pika.BlockingConnection]:
    params = pika.URLParameters(url_of(minibroker) + "?socket_timeout=5&blocked_connection_timeout=5")
    conn = pika.BlockingConnection(params)
    try:
        yield conn
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def channel(connection: pika.BlockingConnection) -> Any:
    return connection.channel()


def pump_until(connection: Any, condition: Any, timeout: float = 5.0) -> None:
    """Let pika deliver until ``condition()`` holds (fails after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        connection.process_data_events(time_limit=0.05)


def get_all(channel: Any, queue: str, *, ack: bool = True) -> list[bytes]:
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=ack)
        if method is None:
            return bodies
        bodies.append(body)


# -- the basics ------------------------------------------------------------------------------------------------
def test_publish_and_get_round_trip_with_properties(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.queue_declare("orders")
    properties = pika.BasicProperties(
        content_type="application/json",
        headers={"kind": "order", "n": 7},
        delivery_mode=2,
        correlation_id="c-1",
        reply_to="replies",
        message_id="m-1",
        app_id="tests",
    )
    channel.basic_publish("", "orders", b'{"id": 1}', properties)
    minibroker.wait_for(queue="orders", depth=1)
    method, got, body = channel.basic_get("orders", auto_ack=False)
    assert body == b'{"id": 1}'
    assert (method.exchange, method.routing_key, method.redelivered, method.message_count) == ("", "orders", False, 0)
    assert got.content_type == "application/json"
    assert got.headers == {"kind": "order", "n": 7}
    assert (got.delivery_mode, got.correlation_id, got.reply_to, got.message_id, got.app_id) == (
        2,
        "c-1",
        "replies",
        "m-1",
        "tests",
    )
    channel.basic_ack(method.delivery_tag)
    assert channel.basic_get("orders") == (None, None, None)
    assert minibroker.queue("orders").depth == 0


def test_get_ok_counts_the_messages_left(channel: Any) -> None:
    channel.queue_declare("counted")
    for n in range(3):
        channel.basic_publish("", "counted", str(n).encode())
    counts = [channel.basic_get("counted", auto_ack=True)[0].message_count for _ in range(3)]
    assert counts == [2, 1, 0]


def test_queue_declare_answers_name_and_counts_and_server_names(channel: Any) -> None:
    ok = channel.queue_declare("counts").method
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("counts", 0, 0)
    channel.basic_publish("", "counts", b"x")
    assert channel.queue_declare("counts", passive=True).method.message_count == 1
    named = channel.queue_declare("", exclusive=True).method.queue
    assert named.startswith("amq.gen-")


def test_passive_declare_of_a_missing_queue_closes_the_channel_with_404(connection: Any) -> None:
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("nowhere", passive=True)
    assert raised.value.reply_code == 404
    assert "nowhere" in raised.value.reply_text
    assert connection.is_open  # a channel error closes only the channel
    assert connection.channel().queue_declare("elsewhere").method.queue == "elsewhere"


def test_consume_ack_nack_reject_and_redelivered(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.queue_declare("work")
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", "work", body)
    channel.basic_qos(prefetch_count=10)
    seen = []
    for method, _properties, body in channel.consume("work", inactivity_timeout=5):
        assert method is not None, "no delivery"
        seen.append((body, method.redelivered))
        if body == b"a":
            channel.basic_ack(method.delivery_tag)
        elif body == b"b" and not method.redelivered:
            channel.basic_nack(method.delivery_tag, requeue=True)
        elif body == b"b":
            channel.basic_ack(method.delivery_tag)
        else:
            channel.basic_reject(method.delivery_tag, requeue=False)
        if len(seen) == 4:
            break
    channel.cancel()
    assert sorted(seen) == [(b"a", False), (b"b", False), (b"b", True), (b"c", False)]
    assert minibroker.queue("work").depth == 0


def test_prefetch_limits_unacked_deliveries(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.queue_declare("limited")
    for n in range(5):
        channel.basic_publish("", "limited", str(n).encode())
    channel.basic_qos(prefetch_count=2)
    held = []
    channel.basic_consume("limited", lambda ch, method, props, body: held.append(method.delivery_tag))
    pump_until(channel.connection, lambda: len(held) == 2)
    channel.connection.process_data_events(time_limit=0.2)  # (nothing to wait for: a third must not come)
    assert len(held) == 2
    assert minibroker.queue("limited").depth == 3
    channel.basic_ack(held[-1], multiple=True)
    pump_until(channel.connection, lambda: len(held) == 4)
    channel.connection.process_data_events(time_limit=0.2)
    assert len(held) == 4
    assert minibroker.queue("limited").depth == 1


def test_an_unknown_delivery_tag_is_a_406(connection: Any) -> None:
    channel = connection.channel()
    channel.basic_ack(99)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("after")  # the close arrives with the next synchronous call
    assert raised.value.reply_code == 406


def test_cancel_then_ack_what_was_held(channel: Any, minibroker: ThreadedBroker) -> None:
    """0-9-1 lets a client ack after basic.cancel: what it held stays its own until then."""
    channel.queue_declare("held")
    channel.basic_publish("", "held", b"x")
    tags: list[int] = []
    tag = channel.basic_consume("held", lambda ch, method, props, body: tags.append(method.delivery_tag))
    pump_until(channel.connection, lambda: len(tags) == 1)
    channel.basic_cancel(tag)
    assert minibroker.queue("held").depth == 0  # still held by the client
    channel.basic_ack(tags[0])
    channel.queue_declare("held", passive=True)  # a round trip: the ack is in
    assert minibroker.queue("held").depth == 0
    assert channel.basic_get("held") == (None, None, None)


# -- exchanges ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "bindings", "published", "expected"),
    [
        ("direct", {"qa": "a", "qb": "b"}, [("a", {}), ("b", {}), ("c", {})], {"qa": 1, "qb": 1}),
        ("fanout", {"qa": "", "qb": "ignored"}, [("x", {})], {"qa": 1, "qb": 1}),
        (
            "topic",
            {"qa": "stock.*.nyse", "qb": "stock.#"},
            [("stock.ibm.nyse", {}), ("stock.ibm", {}), ("bond.x", {})],
            {"qa": 1, "qb": 2},
        ),
    ],
)
def test_exchange_types_route_by_their_bindings(
    channel: Any,
    kind: str,
    bindings: dict[str, str],
    published: list[tuple[str, dict[str, Any]]],
    expected: dict[str, int],
) -> None:
    channel.exchange_declare("ex", kind)
    for queue, key in bindings.items():
        channel.queue_declare(queue)
        channel.queue_bind(queue, "ex", key)
    for key, headers in published:
        channel.basic_publish("ex", key, b"m", pika.BasicProperties(headers=headers))
    assert {q: len(get_all(channel, q)) for q in bindings} == expected


def test_headers_exchange_matches_all_or_any(channel: Any) -> None:
    channel.exchange_declare("hx", "headers")
    channel.queue_declare("all")
    channel.queue_declare("any")
    channel.queue_bind("all", "hx", arguments={"x-match": "all", "format": "pdf", "type": "report"})
    channel.queue_bind("any", "hx", arguments={"x-match": "any", "format": "pdf", "type": "report"})
    channel.basic_publish("hx", "", b"1", pika.BasicProperties(headers={"format": "pdf", "type": "report"}))
    channel.basic_publish("hx", "", b"2", pika.BasicProperties(headers={"format": "pdf"}))
    channel.basic_publish("hx", "", b"3", pika.BasicProperties(headers={"format": "zip"}))
    assert get_all(channel, "all") == [b"1"]
    assert get_all(channel, "any") == [b"1", b"2"]


def test_publish_to_a_missing_exchange_closes_the_channel_with_404(connection: Any) -> None:
    channel = connection.channel()
    channel.basic_publish("no-such-exchange", "k", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        channel.queue_declare("after")
    assert raised.value.reply_code == 404
    assert "no-such-exchange" in raised.value.reply_text


# -- publisher confirms ------------------------------------------------------------------------------------------
def test_confirms_ack_routed_and_unroutable_messages(channel: Any) -> None:
    channel.confirm_delivery()
    channel.queue_declare("confirmed")
    channel.basic_publish("", "confirmed", b"routed")  # returns once acked (raises on nack)
    channel.basic_publish("", "nowhere", b"unroutable")  # not mandatory: acked and dropped
    assert get_all(channel, "confirmed") == [b"routed"]


def test_mandatory_unroutable_is_returned_before_the_ack(channel: Any) -> None:
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as raised:
        channel.basic_publish("", "nowhere", b"lost", mandatory=True)
    (returned,) = raised.value.messages
    assert returned.body == b"lost"
    assert returned.method.reply_code == 312


def test_overflow_reject_publish_nacks(channel: Any) -> None:
    channel.confirm_delivery()
    channel.queue_declare("small", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.basic_publish("", "small", b"1")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", "small", b"2")
    assert get_all(channel, "small") == [b"1"]


# -- channel transactions ----------------------------------------------------------------------------------------
def test_tx_commit_makes_publishes_visible_at_once(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.queue_declare("txq")
    channel.tx_select()
    for n in range(3):
        channel.basic_publish("", "txq", str(n).encode())
    channel.queue_declare("txq", passive=True)  # a round trip: the publishes are in, staged
    assert minibroker.queue("txq").depth == 0
    assert len(minibroker.transactions) == 1
    channel.tx_commit()
    assert minibroker.queue("txq").depth == 3
    assert minibroker.transactions == []


def test_tx_rollback_discards_publishes_and_keeps_acks_unacked(channel: Any, minibroker: ThreadedBroker) -> None:
    channel.queue_declare("txr")
    channel.basic_publish("", "txr", b"kept")
    method, _properties, _body = channel.basic_get("txr", auto_ack=False)
    channel.tx_select()
    channel.basic_publish("", "txr", b"dropped")
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    assert minibroker.queue("txr").depth == 0  # "kept" is still with the client
    channel.basic_ack(method.delivery_tag)  # the ack was rolled back: the tag is the client's to ack again
    channel.tx_commit()
    assert minibroker.queue("txr").depth == 0
    assert channel.basic_get("txr") == (None, None, None)


def test_closing_a_channel_rolls_its_transaction_back(connection: Any, minibroker: ThreadedBroker) -> None:
    channel = connection.channel()
    channel.queue_declare("txc")
    channel.tx_select()
    channel.basic_publish("", "txc", b"never")
    channel.queue_declare("txc", passive=True)
    assert len(minibroker.transactions) == 1
    channel.close()
    minibroker.wait_for(transactions=0)
    assert minibroker.queue("txc").depth == 0


def test_confirm_and_tx_do_not_mix(connection: Any) -> None:
    confirming = connection.channel()
    confirming.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        confirming.tx_select()
    assert raised.value.reply_code == 406
    transactional = connection.channel()
    transactional.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        transactional.confirm_delivery()
    assert raised.value.reply_code == 406


# -- connection-level ---------------------------------------------------------------------------------------------
def test_unknown_vhost_is_refused(minibroker: ThreadedBroker) -> None:
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(pika.URLParameters(url_of(minibroker, "no-such-vhost") + "?socket_timeout=5"))


def test_an_exclusive_consumer_locks_out_others_with_403(minibroker: ThreadedBroker, channel: Any) -> None:
    channel.queue_declare("solo")
    channel.basic_consume("solo", lambda *args: None, exclusive=True)
    other = pika.BlockingConnection(pika.URLParameters(url_of(minibroker) + "?socket_timeout=5"))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            other.channel().basic_consume("solo", lambda *args: None)
        assert raised.value.reply_code == 403
        assert "in exclusive use" in raised.value.reply_text
    finally:
        other.close()


def test_another_connections_exclusive_queue_is_405(minibroker: ThreadedBroker, channel: Any) -> None:
    channel.queue_declare("mine", exclusive=True)
    other = pika.BlockingConnection(pika.URLParameters(url_of(minibroker) + "?socket_timeout=5"))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            other.channel().basic_consume("mine", lambda *args: None)
        assert raised.value.reply_code == 405
    finally:
        other.close()
