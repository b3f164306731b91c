"""Source filters as Qpid JMS and Artemis clients send them (Part 3 §3.5.8 filter-set): JMS selectors
(``apache.org:selector-filter:string``) on queues and topic subscriptions, and the no-local filter
(``apache.org:no-local-filter:list``), attached with python-qpid-proton against the real broker.

The attach reply carries the filters the broker applied, and only those: a client learns from it which of
its filters are in force (§3.5.3, source filter).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Described, Message, symbol
from proton.reactor import DurableSubscription, Filter, Selector
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import queue_stats, wait_for
from tests.integration.proton_options import (
    NO_LOCAL,
    SELECTOR,
    NoLocal,
    assert_nothing_more,
    broker_with,
    close,
    connection,
    data_object,
    refusal,
    take,
)

MESSAGES = [
    Message(id="m1", subject="order", priority=9, durable=True, properties={"color": "red", "amount": 15}),
    Message(id="m2", subject="invoice", correlation_id="c-7", properties={"color": "blue", "amount": 5}),
    Message(id="m3", subject="order", priority=1, properties={"color": "red", "amount": 25, "name": "apple"}),
    Message(id=42, properties={"color": "green", "name": "avocado"}),
]


def take_ids(conn: BlockingConnection, receiver: BlockingReceiver, count: int) -> list[Any]:
    ids = []
    for _ in range(count):
        ids.append(receiver.receive().id)
        receiver.accept()
    return ids


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("color = 'red'", ["m1", "m3"]),  # application-properties
        ("amount BETWEEN 10 AND 20", ["m1"]),
        ("name LIKE 'a%' AND color <> 'red'", [42]),
        ("color IN ('blue', 'green')", ["m2", 42]),
        ("amount IS NULL", [42]),
        ("JMSPriority > 4", ["m1"]),  # header
        ("JMSDeliveryMode = 'PERSISTENT'", ["m1"]),
        ("JMSType = 'order' AND amount > 20", ["m3"]),  # properties.subject
        ("JMSMessageID = 'ID:AMQP_NO_PREFIX:m2'", ["m2"]),  # properties.message-id, as Qpid JMS renders it
        ("JMSMessageID = 'ID:AMQP_ULONG:42'", [42]),
        ("JMSCorrelationID = 'c-7'", ["m2"]),
    ],
)
def test_selector_on_a_queue(broker: ThreadedBroker, selector: str, expected: list[Any]) -> None:
    with connection(broker) as conn:
        sender = conn.create_sender("selected")
        for message in MESSAGES:
            sender.send(message)
        receiver = conn.create_receiver("selected", credit=10, options=Selector(selector))
        applied = data_object(receiver.link.remote_source.filter)
        assert applied == {symbol("selector"): Described(SELECTOR, selector)}
        assert take_ids(conn, receiver, len(expected)) == expected
        # nothing else was sent to it: everything it did not take is still ready, nothing is out
        remaining = len(MESSAGES) - len(expected)
        wait_for(lambda: queue_stats(broker, "selected") == (remaining, 0), "the accepts", conn=conn)
        assert receiver.fetcher is not None
        assert receiver.fetcher.has_message == 0

        # what the selector left behind goes to a consumer without one, in order
        rest = conn.create_receiver("selected", name="rest", credit=10)
        others = [m.id for m in sorted(MESSAGES, key=lambda m: -m.priority) if m.id not in expected]  # priority first
        assert take_ids(conn, rest, remaining) == others


def test_selective_consumers_share_a_queue(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        reds = conn.create_receiver("mixed", name="reds", credit=10, options=Selector("color = 'red'"))
        others = conn.create_receiver("mixed", name="others", credit=10, options=Selector("color <> 'red'"))
        sender = conn.create_sender("mixed")
        for i, color in enumerate(["red", "blue", "red", "green", "red"]):
            sender.send(Message(body=i, properties={"color": color}))
        assert take(reds, 3) == [0, 2, 4]
        assert take(others, 2) == [1, 3]
        wait_for(lambda: queue_stats(broker, "mixed") == (0, 0), "the accepts", conn=conn)


def test_selector_on_a_topic_subscription() -> None:
    with broker_with(topics={"prices": {}}) as broker, connection(broker) as conn:
        cheap = conn.create_receiver("prices", name="cheap", credit=10, options=Selector("price < 10"))
        everything = conn.create_receiver("prices", name="all", credit=10)
        sender = conn.create_sender("prices")
        for price in (5, 50, 7, 70):
            sender.send(Message(body=price, properties={"price": price}))
        assert take(everything, 4) == [5, 50, 7, 70]
        assert take(cheap, 2) == [5, 7]
        assert_nothing_more(cheap)

        stored = sorted(s.enqueued_total for s in broker.topic("prices").subscriptions())
        assert stored == [2, 4]  # a subscription never stores what it does not select


def test_durable_subscription_resumed_with_another_selector_starts_afresh() -> None:
    with broker_with(topics={"news": {}}) as broker:
        for selector in ("kind = 'a'", "kind = 'b'"):  # (JMS: changing the selector replaces the subscription)
            with connection(broker, container_id="app") as conn:
                conn.create_receiver("news", name="sub", options=[DurableSubscription(), Selector(selector)])
        with connection(broker) as publisher:
            sender = publisher.create_sender("news")
            for kind in ("a", "b"):
                sender.send(Message(body=kind, properties={"kind": kind}))

        stored = {(s.container, s.name): s.depth for s in broker.topic("news").subscriptions()}
        assert stored == {("app", "sub"): 1}  # "b" only: the "a" subscription is gone
        with connection(broker, container_id="app") as conn:
            sub = conn.create_receiver("news", name="sub", options=[DurableSubscription(), Selector("kind = 'b'")])
            assert take(sub, 1) == ["b"]
            close(sub)


@pytest.mark.parametrize("selector", ["color = ", "color === 'red'", "'red'", "color IN ()", "a + 1"])
def test_invalid_selector_is_refused(broker: ThreadedBroker, selector: str) -> None:
    with connection(broker) as conn:
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("strict", options=Selector(selector))
        assert refusal(refused.value) == "amqp:invalid-field"
        # the connection is still fine
        conn.create_sender("strict").send(Message(body="ok"))
        assert take(conn.create_receiver("strict", name="plain"), 1) == ["ok"]


def test_selector_must_hold_a_string(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("strict", options=Filter({symbol("selector"): Described(SELECTOR, 42)}))
        assert refusal(refused.value) == "amqp:invalid-field"


def test_only_applied_filters_are_echoed(broker: ThreadedBroker) -> None:
    filters = {
        symbol("jms-selector"): Described(SELECTOR, "x = 1"),
        symbol("mystery"): Described(symbol("example.org:unknown-filter:string"), "?"),
    }
    with connection(broker) as conn:
        receiver = conn.create_receiver("filtered", options=Filter(filters))
        assert data_object(receiver.link.remote_source.filter) == {symbol("jms-selector"): Described(SELECTOR, "x = 1")}


def test_no_local_subscription_skips_its_own_connections_messages() -> None:
    with (
        broker_with(topics={"chat": {}}) as broker,
        connection(broker) as mine,
        connection(broker) as theirs,
    ):
        quiet = mine.create_receiver("chat", name="no-local", credit=10, options=NoLocal())
        assert data_object(quiet.link.remote_source.filter) == {symbol("no-local"): Described(NO_LOCAL, [])}
        echo = mine.create_receiver("chat", name="echo", credit=10)  # the same connection, no filter
        mine.create_sender("chat").send(Message(body="from me"))
        theirs.create_sender("chat").send(Message(body="from them"))
        assert take(echo, 2) == ["from me", "from them"]
        assert take(quiet, 1) == ["from them"]
        assert_nothing_more(quiet)


def test_resumed_no_local_durable_subscription_skips_its_new_connection() -> None:
    options = [DurableSubscription(), NoLocal()]
    with broker_with(topics={"chat": {}}) as broker:
        with connection(broker, container_id="app") as first:
            first.create_receiver("chat", name="sub", options=options)  # then the connection goes away
        with connection(broker, container_id="app") as second, connection(broker) as other:
            sub = second.create_receiver("chat", name="sub", credit=10, options=options)
            second.create_sender("chat").send(Message(body="from the resumed connection"))
            other.create_sender("chat").send(Message(body="from elsewhere"))
            assert take(sub, 1) == ["from elsewhere"]
            assert_nothing_more(sub)
            close(sub)


# -- cost, whatever a peer sends (issue 12) ----------------------------------------------------------------
def test_a_selector_longer_than_the_limit_is_refused(broker: ThreadedBroker) -> None:
    """``broker.max_selector_length`` (4096 characters by default): refused like an invalid selector."""
    longest = "a = 1" + " OR a = 1" * 454 + "    "  # 4095 characters
    with connection(broker) as conn:
        conn.create_receiver("limited", name="longest", options=Selector(longest))
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("limited", name="longer", options=Selector(longest + " OR b = 2"))
        assert refusal(refused.value) == "amqp:invalid-field"
        assert "longer than the limit of 4096" in str(refused.value.link.remote_condition.description)
        conn.create_sender("limited").send(Message(body="ok"))  # the connection is still fine
        assert take(conn.create_receiver("limited", name="plain"), 1) == ["ok"]


def test_huge_application_properties_are_left_to_consumers_without_a_selector(broker: ThreadedBroker) -> None:
    """A message whose application-properties exceed ``broker.max_selector_properties_size`` (64 KiB) is not
    decoded for selectors: a selector consumer does not get it, a consumer without a selector does."""
    with connection(broker) as conn:
        sender = conn.create_sender("big")
        sender.send(Message(body="huge", properties={"color": "red", "pad": "x" * 100_000}))
        sender.send(Message(body="small", properties={"color": "red"}))
        reds = conn.create_receiver("big", name="reds", credit=10, options=Selector("color = 'red'"))
        assert take(reds, 1) == ["small"]
        assert_nothing_more(reds)
        everything = conn.create_receiver("big", name="everything", credit=10)
        assert take(everything, 1) == ["huge"]


def test_a_long_like_pattern_against_a_large_property() -> None:
    """The issue's attack, with the limits lifted: a 30 kB LIKE pattern against 1 MB properties kept the broker
    busy for a minute per message. Now both messages are through within the blocking timeout."""
    pattern = "%_" + "a" * 30_000 + "b%"
    no_limits = {"max_selector_length": 0, "max_selector_properties_size": 0}
    with broker_with(broker=no_limits) as broker, connection(broker) as conn:
        sender = conn.create_sender("like")
        sender.send(Message(body="no", properties={"p": "a" * 1_000_000}))
        sender.send(Message(body="yes", properties={"p": "z" * 500_000 + "c" + "a" * 30_000 + "b"}))
        receiver = conn.create_receiver("like", credit=10, options=Selector(f"p LIKE '{pattern}'"))
        assert take(receiver, 1) == ["yes"]
        with connection(broker) as bystander:  # and the broker answers everyone else at once
            started = time.perf_counter()
            bystander.create_sender("other").send(Message(body="ping"))
            assert time.perf_counter() - started < 2.0
