"""The azure-servicebus SDK's ``$management`` operations against ``--personality servicebus`` (issue 17 item 6):
peek, schedule and cancel, receive deferred messages by sequence number and settle them. Real SDK, no mocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)

from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(60)


def _send(client: ServiceBusClient, queue: str, *bodies: str) -> None:
    with client.get_queue_sender(queue) as sender:
        for body in bodies:
            sender.send_messages(ServiceBusMessage(body))


def test_peek_empty(client: ServiceBusClient) -> None:
    with client.get_queue_receiver("nothing") as receiver:
        assert receiver.peek_messages(max_message_count=5) == []


def test_peek_leaves_messages(client: ServiceBusClient) -> None:
    _send(client, "peeked", "a", "b", "c")
    with client.get_queue_receiver("peeked") as receiver:
        peeked = receiver.peek_messages(max_message_count=2)
        assert [str(m) for m in peeked] == ["a", "b"]
        assert peeked[0].sequence_number < peeked[1].sequence_number
        rest = receiver.peek_messages(max_message_count=5)  # from after the last one peeked
        assert [str(m) for m in rest] == ["c"]
        again = receiver.peek_messages(max_message_count=5, sequence_number=peeked[0].sequence_number)
        assert [str(m) for m in again] == ["a", "b", "c"]
        received = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        while len(received) < 3:
            received += receiver.receive_messages(max_message_count=3, max_wait_time=2)
        assert [str(m) for m in received] == ["a", "b", "c"]
        for message in received:
            receiver.complete_message(message)


def test_schedule_and_cancel(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    client = virtual_client
    later = datetime.fromtimestamp(virtual_broker.clock.now, UTC) + timedelta(hours=1)
    with client.get_queue_sender("later") as sender:
        (kept,) = sender.schedule_messages(ServiceBusMessage("kept"), later)
        dropped = sender.schedule_messages([ServiceBusMessage("dropped"), ServiceBusMessage("too")], later)
        assert len(dropped) == 2
        assert kept not in dropped
        sender.cancel_scheduled_messages(dropped)
    with client.get_queue_receiver("later") as receiver:
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        virtual_broker.clock.advance(3601)
        received = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        assert [str(m) for m in received] == ["kept"]
        assert received[0].sequence_number == kept
        receiver.complete_message(received[0])
        assert receiver.receive_messages(max_message_count=3, max_wait_time=1) == []


def test_receive_deferred_and_settle(client: ServiceBusClient) -> None:
    _send(client, "deferred", "one", "two", "three")
    with client.get_queue_receiver("deferred") as receiver:
        received = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        while len(received) < 3:
            received += receiver.receive_messages(max_message_count=3, max_wait_time=2)
        numbers = {str(m): m.sequence_number for m in received}
        for message in received:
            receiver.defer_message(message)
        assert [str(m) for m in receiver.peek_messages(max_message_count=5, sequence_number=1)] == [
            "one",
            "two",
            "three",
        ]
        one, two, three = receiver.receive_deferred_messages([numbers["one"], numbers["two"], numbers["three"]])
        assert [str(one), str(two), str(three)] == ["one", "two", "three"]
        assert one.lock_token is not None
        receiver.complete_message(one)
        receiver.abandon_message(two)  # stays deferred
        receiver.dead_letter_message(three, reason="bad", error_description="very")
        (two_again,) = receiver.receive_deferred_messages([numbers["two"]])
        assert str(two_again) == "two"
        receiver.complete_message(two_again)
        assert receiver.peek_messages(max_message_count=5, sequence_number=1) == []
    with client.get_queue_receiver("deferred", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(dead) == "three"
        assert dead.dead_letter_reason == "bad"
        receiver.complete_message(dead)


def test_receive_deferred_and_delete(client: ServiceBusClient) -> None:
    _send(client, "deferred-rad", "x")
    with client.get_queue_receiver("deferred-rad") as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.defer_message(message)
    with client.get_queue_receiver("deferred-rad", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
        (taken,) = receiver.receive_deferred_messages([message.sequence_number])
        assert str(taken) == "x"
        assert receiver.peek_messages(max_message_count=5, sequence_number=1) == []


def test_peek_shows_locked_deferred_and_scheduled(
    virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient
) -> None:
    client = virtual_client
    _send(client, "everything", "locked", "deferred")
    later = datetime.fromtimestamp(virtual_broker.clock.now, UTC) + timedelta(hours=1)
    with client.get_queue_sender("everything") as sender:
        sender.schedule_messages(ServiceBusMessage("scheduled"), later)
    _send(client, "everything", "ready")
    with client.get_queue_receiver("everything", prefetch_count=0) as receiver:
        received = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        while len(received) < 2:
            received += receiver.receive_messages(max_message_count=2, max_wait_time=2)
        locked, deferred = received[:2]
        assert [str(locked), str(deferred)] == ["locked", "deferred"]
        receiver.defer_message(deferred)
        peeked = receiver.peek_messages(max_message_count=10, sequence_number=1)
        assert [(str(m), m.state) for m in peeked] == [
            ("locked", ServiceBusMessageState.ACTIVE),
            ("deferred", ServiceBusMessageState.DEFERRED),
            ("scheduled", ServiceBusMessageState.SCHEDULED),
            ("ready", ServiceBusMessageState.ACTIVE),
        ]
        receiver.complete_message(locked)
