"""Review of issue 17: Service Bus messages in the journal (``data_dir``) with the real azure-servicebus SDK: a
restart keeps a queue's and a subscription's messages (reached under another case of their names; the SDKs send
them non-durable, Service Bus stores every message) and numbers new messages after them. Their own sequence
numbers are not kept yet (the journal does not record them): an xfail says so."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from minibroker.testing.thread import run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


@contextmanager
def _client(data_dir: Path) -> Iterator[ServiceBusClient]:
    """A ``servicebus`` broker journaling to ``data_dir``, and the SDK's client of it."""
    config = {"server": {"port": 0}, "broker": {"personality": "servicebus"}, "data_dir": str(data_dir)}
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as client,
    ):
        yield client


def _restart(tmp_path: Path) -> tuple[list[int | None], list[int | None]]:
    """Sequence numbers of the queue's two messages before a restart, and of them and a third sent after it."""
    with _client(tmp_path) as client:
        with client.get_subscription_receiver("News", "Audit") as receiver:
            assert receiver.receive_messages(max_message_count=1, max_wait_time=1) == []
        with client.get_queue_sender("Orders") as sender:
            sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        with client.get_topic_sender("News") as sender:
            sender.send_messages(ServiceBusMessage("n"))
        with client.get_queue_receiver("Orders") as receiver:
            before = [m.sequence_number for m in receiver.peek_messages(10)]
    with _client(tmp_path) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages(ServiceBusMessage("c"))
        with client.get_queue_receiver("orders") as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
            assert [str(m) for m in got] == ["a", "b", "c"]
            numbers = [m.sequence_number for m in got]
            for message in got:
                receiver.complete_message(message)
        with client.get_subscription_receiver("news", "audit") as receiver:
            got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
            assert [str(m) for m in got] == ["n"]
            receiver.complete_message(got[0])
    return before, numbers


def test_a_restart_keeps_queue_and_subscription_messages(tmp_path: Path) -> None:
    _before, after = _restart(tmp_path)
    assert None not in after
    assert after == sorted(after)
    assert len(set(after)) == 3


@pytest.mark.xfail(strict=True, reason="the journal does not record a message's sequence number (left, see report)")
def test_sequence_numbers_survive_a_restart(tmp_path: Path) -> None:
    before, after = _restart(tmp_path)
    assert after[:2] == before
