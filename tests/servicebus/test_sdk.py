"""The azure-servicebus SDK against ``--personality servicebus`` (issue 17 items 1 to 4): real SDK, no mocks."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

pytestmark = pytest.mark.timeout(60)


def test_send_receive_complete(client: ServiceBusClient) -> None:
    with client.get_queue_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("hello", application_properties={"k": "v"}))
    with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
        received = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert [str(m) for m in received] == ["hello"]
        message = received[0]
        assert message.application_properties == {b"k": b"v"}
        assert message.lock_token is not None
        receiver.complete_message(message)
    with client.get_queue_receiver("orders", max_wait_time=1) as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def _send(client: ServiceBusClient, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as sender:
        for body in bodies:
            sender.send_messages(ServiceBusMessage(body))


def test_receive_and_delete(client: ServiceBusClient) -> None:
    _send(client, "rad", "a", "b")
    with client.get_queue_receiver("rad", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        assert sorted(str(m) for m in received) == ["a", "b"]
    with client.get_queue_receiver("rad") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_abandon_redelivers_counting(client: ServiceBusClient) -> None:
    _send(client, "abandon", "x")
    with client.get_queue_receiver("abandon") as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert first.delivery_count == 0
        receiver.abandon_message(first)
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(again) == "x"
        assert again.delivery_count == 1
        receiver.complete_message(again)


def test_dead_letter_with_reason(client: ServiceBusClient) -> None:
    _send(client, "dlq", "poison")
    with client.get_queue_receiver("dlq") as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(message, reason="bad", error_description="it was bad")
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with client.get_queue_receiver("dlq", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "poison"
        assert dead.dead_letter_reason == "bad"
        assert dead.dead_letter_error_description == "it was bad"
        assert dead.dead_letter_source == "dlq"
        receiver.complete_message(dead)


def test_defer_sets_aside(client: ServiceBusClient) -> None:
    _send(client, "defer", "later", "now")
    with client.get_queue_receiver("defer") as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        by_body = {str(m): m for m in received}
        receiver.defer_message(by_body["later"])
        receiver.abandon_message(by_body["now"])
        (again,) = receiver.receive_messages(max_message_count=2, max_wait_time=2)
        assert str(again) == "now"
        receiver.complete_message(again)
    with client.get_queue_receiver("defer") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []


def test_max_delivery_count_dead_letters(client: ServiceBusClient) -> None:
    _send(client, "mdc", "flaky")
    with client.get_queue_receiver("mdc") as receiver:
        for _ in range(10):
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.abandon_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
    with client.get_queue_receiver("mdc", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "flaky"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        receiver.complete_message(dead)


def test_batch_splits(client: ServiceBusClient) -> None:
    with client.get_queue_sender("batch") as sender:
        batch = sender.create_message_batch()
        for body in ("one", "two", "three"):
            batch.add_message(ServiceBusMessage(body))
        sender.send_messages(batch)
    with client.get_queue_receiver("batch") as receiver:
        received = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        while len(received) < 3:
            more = receiver.receive_messages(max_message_count=3, max_wait_time=2)
            assert more
            received += more
        assert [str(m) for m in received] == ["one", "two", "three"]
        for message in received:
            receiver.complete_message(message)


def test_message_fields(client: ServiceBusClient) -> None:
    _send(client, "fields", "a", "b")
    with client.get_queue_receiver("fields") as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        while len(received) < 2:
            received += receiver.receive_messages(max_message_count=2, max_wait_time=2)
        first, second = received
        assert first.sequence_number is not None
        assert second.sequence_number is not None
        assert first.sequence_number < second.sequence_number
        assert first.enqueued_time_utc is not None
        assert first.locked_until_utc is not None
        assert first.message_id is not None
        assert first.lock_token != second.lock_token
        for message in received:
            receiver.complete_message(message)


def test_topic_subscription(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("events", "audit") as receiver:
        with client.get_topic_sender("events") as sender:
            sender.send_messages(ServiceBusMessage("happened"))
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(message) == "happened"
        receiver.complete_message(message)


def test_send_a_list(client: ServiceBusClient) -> None:
    with client.get_queue_sender("listed") as sender:
        sender.send_messages([ServiceBusMessage("one"), ServiceBusMessage("two")])
    with client.get_queue_receiver("listed") as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        while len(received) < 2:
            more = receiver.receive_messages(max_message_count=2, max_wait_time=2)
            assert more
            received += more
        assert [str(m) for m in received] == ["one", "two"]
        for message in received:
            receiver.complete_message(message)


def test_subscription_dead_letter(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("alerts", "ops") as receiver:
        with client.get_topic_sender("alerts") as sender:
            sender.send_messages(ServiceBusMessage("fire"))
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(message, reason="ignored")
    with client.get_subscription_receiver("alerts", "ops", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "fire"
        assert dead.dead_letter_reason == "ignored"
        assert dead.dead_letter_source == "alerts/Subscriptions/ops"
        receiver.complete_message(dead)
