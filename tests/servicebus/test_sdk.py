"""The azure-servicebus SDK against ``--personality servicebus`` (issue 17 items 1 to 4): real SDK, no mocks."""

from __future__ import annotations

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

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
