"""Review of issue 17 (config, JS fixes): probes with the real azure-servicebus SDK against the real broker.

Service Bus entity paths are case-insensitive (``Orders`` and ``orders`` are one queue; the broker already keys
entity properties by ``entities.key`` and finds a subscription by its name without regard to case in
``$management``); a message locked by a receiver when its time-to-live passes is not expired while locked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError, MessagingEntityNotFoundError

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def _broker(**servicebus: Any) -> Iterator[ThreadedBroker]:
    config: dict[str, Any] = {"server": {"port": 0}, "broker": {"personality": "servicebus", "clock": "virtual"}}
    if servicebus:
        config["servicebus"] = servicebus
    with run_in_thread(config) as broker:
        yield broker


@pytest.fixture
def plain() -> Iterator[ThreadedBroker]:
    yield from _broker()


@pytest.fixture
def declared() -> Iterator[ThreadedBroker]:
    yield from _broker(
        queues={
            "Orders": {"max_delivery_count": 1},
            "Expiring": {"default_message_time_to_live": "PT10S", "dead_lettering_on_message_expiration": True},
        },
        topics={"Events": {"subscriptions": {"Audit": {"max_delivery_count": 1}}}},
    )


def _client(broker: ThreadedBroker) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0)


def _bodies(receiver: Any, count: int = 10) -> list[str]:
    return [str(m) for m in receiver.receive_messages(max_message_count=count, max_wait_time=2)]


def _complete_one(receiver: Any) -> str:
    """Receive exactly one message, complete it, and give its body."""
    (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
    receiver.complete_message(message)
    return str(message)


def test_queue_names_are_case_insensitive(plain: ThreadedBroker) -> None:
    with _client(plain) as client:
        with client.get_queue_sender("Orders") as sender:
            sender.send_messages(ServiceBusMessage("a"))
        with client.get_queue_sender("ORDERS") as sender:
            sender.send_messages(ServiceBusMessage("b"))
        with client.get_queue_receiver("orders") as receiver:
            assert [str(m) for m in receiver.peek_messages(10)] == ["a", "b"]
            got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
            assert [str(m) for m in got] == ["a", "b"]
            for message in got:
                receiver.complete_message(message)


def test_declared_properties_apply_under_any_case(declared: ThreadedBroker) -> None:
    """``Orders`` declared with MaxDeliveryCount 1: a sender of ``orders`` reaches it, and one abandon
    dead-letters the message, read from ``ORDERS``'s dead-letter queue."""
    with _client(declared) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        with client.get_queue_receiver("ORDERS") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.abandon_message(message)
            assert _bodies(receiver) == []
        with client.get_queue_receiver("Orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=5)
            assert (str(dead), dead.dead_letter_reason) == ("x", "MaxDeliveryCountExceeded")
            dlq.complete_message(dead)


def test_declared_topic_under_another_case_stays_a_topic(declared: ThreadedBroker) -> None:
    """A sender of ``events`` (the declared topic ``Events``) publishes to its declared subscription, read as
    ``AUDIT``."""
    with _client(declared) as client:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("e"))
        with client.get_subscription_receiver("EVENTS", "AUDIT") as receiver:
            assert [str(m) for m in receiver.peek_messages(10)] == ["e"]
            _complete_one(receiver)


def test_subscription_names_are_case_insensitive_in_attach(plain: ThreadedBroker) -> None:
    """``Audit`` and ``audit`` of one topic are one subscription: a message is received once, from either."""
    with _client(plain) as client:
        with client.get_subscription_receiver("news", "Audit") as first:
            assert _bodies(first, 1) == []
        with client.get_topic_sender("news") as sender:
            sender.send_messages(ServiceBusMessage("n"))
        with client.get_subscription_receiver("news", "audit") as second:
            assert [str(m) for m in second.peek_messages(10)] == ["n"]
            _complete_one(second)
        with client.get_subscription_receiver("news", "AUDIT") as third:
            assert _bodies(third) == []


def test_ttl_does_not_expire_a_locked_message(declared: ThreadedBroker) -> None:
    """``Expiring`` (ttl 10 s, dead-lettering on expiry): a message locked when its ttl passes stays locked and
    its completion succeeds; nothing is dead-lettered or left."""
    with _client(declared) as client:
        with client.get_queue_sender("Expiring") as sender:
            sender.send_messages(ServiceBusMessage("t"))
        with client.get_queue_receiver("Expiring") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            declared.clock.advance(20)
            receiver.complete_message(message)
            assert _bodies(receiver) == []
        with client.get_queue_receiver("Expiring", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            assert _bodies(dlq) == []


def test_ttl_passed_while_locked_expires_once_when_the_lock_ends(declared: ThreadedBroker) -> None:
    """The same message abandoned after its ttl passed: dead-lettered once with TTLExpiredException, never
    redelivered."""
    with _client(declared) as client:
        with client.get_queue_sender("Expiring") as sender:
            sender.send_messages(ServiceBusMessage("t"))
        with client.get_queue_receiver("Expiring") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            declared.clock.advance(20)
            receiver.abandon_message(message)
            assert _bodies(receiver) == []
        with client.get_queue_receiver("Expiring", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            got = dlq.receive_messages(max_message_count=10, max_wait_time=2)
            assert [(str(m), m.dead_letter_reason) for m in got] == [("t", "TTLExpiredException")]
            for dead in got:
                dlq.complete_message(dead)


def test_a_subscription_outlives_its_receiver(plain: ThreadedBroker) -> None:
    """A Service Bus subscription is an entity: the SDK closing its receiver (detach closed=true) leaves it and
    its messages; what the topic gets later still reaches it."""
    with _client(plain) as client:
        with client.get_subscription_receiver("news", "audit") as first:
            assert _bodies(first, 1) == []
        with client.get_topic_sender("news") as sender:
            sender.send_messages([ServiceBusMessage("1"), ServiceBusMessage("2")])
        with client.get_subscription_receiver("news", "audit") as second:
            assert _complete_one(second) == "1"
        with client.get_subscription_receiver("news", "audit") as third:
            assert _complete_one(third) == "2"


def test_a_declared_subscription_outlives_its_first_receiver(declared: ThreadedBroker) -> None:
    with _client(declared) as client:
        with client.get_subscription_receiver("Events", "Audit") as first:
            assert _bodies(first, 1) == []
        with client.get_topic_sender("Events") as sender:
            sender.send_messages(ServiceBusMessage("kept"))
        with client.get_subscription_receiver("Events", "Audit") as second:
            assert _complete_one(second) == "kept"


def test_ttl_passed_while_locked_expires_once_when_the_lock_runs_out(declared: ThreadedBroker) -> None:
    """The lock (60 s) runs out after the ttl (10 s) passed: the message is dead-lettered once
    (TTLExpiredException), never delivered again, and the old lock's completion fails."""
    with _client(declared) as client:
        with client.get_queue_sender("expiring") as sender:
            sender.send_messages(ServiceBusMessage("t"))
        with client.get_queue_receiver("Expiring") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            declared.clock.advance(61)
            assert _bodies(receiver) == []
            with pytest.raises(MessageLockLostError):
                receiver.complete_message(message)
        with client.get_queue_receiver("EXPIRING", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            got = dlq.receive_messages(max_message_count=10, max_wait_time=2)
            assert [(str(m), m.dead_letter_reason) for m in got] == [("t", "TTLExpiredException")]


def test_a_queue_has_no_subscriptions(plain: ThreadedBroker) -> None:
    """``t/Subscriptions/s`` when ``t`` is a queue names nothing: a receiver is refused (not found, raised as the
    SDK opens it); the queue's own message is not taken through it (test_management_probes: nor peeked)."""
    with _client(plain) as client:
        with client.get_queue_sender("t") as sender:
            sender.send_messages(ServiceBusMessage("q"))
        with pytest.raises(MessagingEntityNotFoundError), client.get_subscription_receiver("t", "s") as receiver:
            receiver.receive_messages(max_message_count=1, max_wait_time=2)
        with client.get_queue_receiver("T") as receiver:
            assert _bodies(receiver) == ["q"]
