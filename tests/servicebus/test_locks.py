"""Peek-locks of the ``servicebus`` personality with the azure-servicebus SDK (issue 17 item 5), on the virtual
clock: a lock runs out after 60 s of broker time (the message comes back, a delivery counted; its late
settlement raises MessageLockLostError), and renew-lock extends it. Real SDK, no mocks."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageLockLostError, MessageNotFoundError

from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(60)


def _send(client: ServiceBusClient, queue: str, body: str) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body))


def test_lock_expires_and_message_comes_back(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    _send(virtual_client, "expiring", "x")
    with virtual_client.get_queue_receiver("expiring") as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert first.delivery_count == 0
        locked_until = first.locked_until_utc
        assert locked_until is not None
        assert abs(locked_until.timestamp() - (virtual_broker.clock.now + 60)) < 2
        virtual_broker.clock.advance(30)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []  # still locked
        virtual_broker.clock.advance(31)
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(again) == "x"
        assert again.delivery_count == 1
        assert again.lock_token != first.lock_token
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        receiver.complete_message(again)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []


def test_renew_lock_extends_it(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    _send(virtual_client, "renewed", "y")
    with virtual_client.get_queue_receiver("renewed") as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        virtual_broker.clock.advance(50)
        renewed = receiver.renew_message_lock(message)
        assert abs(renewed.timestamp() - (virtual_broker.clock.now + 60)) < 2
        virtual_broker.clock.advance(50)  # 100 s after delivery: past the first lock, within the renewed one
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
        receiver.complete_message(message)
        virtual_broker.clock.advance(61)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []


def test_renew_lost_lock_fails(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    _send(virtual_client, "lost", "z")
    with virtual_client.get_queue_receiver("lost") as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        virtual_broker.clock.advance(61)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(message)


def _deferred(client: ServiceBusClient, queue: str, body: str) -> int:
    """Send ``body`` to ``queue`` and defer it; its sequence number."""
    _send(client, queue, body)
    with client.get_queue_receiver(queue) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.defer_message(message)
    number: int = message.sequence_number
    return number


def test_a_deferred_message_lock_runs_out(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    """The lock of a deferred message received by sequence number runs out after the lock duration (60 s) of
    broker time: settling it then raises MessageLockLostError (410), renewing it too, and the message stays
    deferred (received again by its number); renew-lock before then extends it."""
    number = _deferred(virtual_client, "deferred-locks", "d")
    with virtual_client.get_queue_receiver("deferred-locks") as receiver:
        (first,) = receiver.receive_deferred_messages([number])
        virtual_broker.clock.advance(61)
        with pytest.raises(MessageLockLostError):
            receiver.complete_message(first)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(first)
        (again,) = receiver.receive_deferred_messages([number])  # still deferred
        assert str(again) == "d"
        virtual_broker.clock.advance(50)
        renewed = receiver.renew_message_lock(again)
        assert abs(renewed.timestamp() - (virtual_broker.clock.now + 60)) < 2
        virtual_broker.clock.advance(50)  # past the first lock, within the renewed one
        receiver.complete_message(again)
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([number])  # completed: gone
