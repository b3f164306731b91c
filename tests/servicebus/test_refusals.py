"""Refusals of other kinds than the session ones reach azure-servicebus 7.15 as errors it can read (issue 17):
pyamqp reads a rejected outcome's error by position (``_pyamqp/client.py`` ``SendClient._on_send_complete`` takes
``error_info[0][2]``), so the Error inside the Rejected inside a disposition must carry every field, or the
SDK's send hangs. Real SDK against the real broker; each send must raise promptly."""

from __future__ import annotations

import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from minibroker.amqp.definitions import Detach, Disposition, Error, Rejected
from minibroker.amqp.framing import encode_frame, encode_frame_all_fields
from minibroker.amqp.types import Symbol
from minibroker.testing.thread import run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def test_a_full_queue_refuses_a_send_promptly() -> None:
    """A queue at its ``max_messages`` rejects the next message (``amqp:resource-limit-exceeded``): the SDK's
    send raises within its timeout instead of hanging."""
    config = {
        "server": {"port": 0},
        "broker": {"personality": "servicebus"},
        "node_defaults": {"max_messages": 1},
    }
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as client,
        client.get_queue_sender("full") as sender,
    ):
        sender.send_messages(ServiceBusMessage("fits"), timeout=10)
        started = time.monotonic()
        with pytest.raises(ServiceBusError, match="full"):
            sender.send_messages(ServiceBusMessage("one too many"), timeout=10)
        assert time.monotonic() - started < 5


def _field_counts(encoded: bytes) -> list[int]:
    """The field count of each described list in ``encoded`` (list8 ``0xc0`` after a small-ulong descriptor)."""
    return [
        encoded[at + 5]
        for at in range(len(encoded) - 5)
        if encoded[at : at + 2] == b"\x00\x53" and encoded[at + 3] == 0xC0
    ]


def test_nested_composites_carry_every_field() -> None:
    """``encode_frame_all_fields`` (the servicebus personality's frames) writes the error inside a rejected outcome
    inside a disposition, and a detach's error, with every field (error: condition, description, info); the
    trimmed encoding other personalities use keeps trimming them."""
    rejected = Disposition(role=True, first=0, settled=True, state=Rejected(error=Error(condition=Symbol("x:y"))))
    detach = Detach(handle=0, closed=True, error=Error(condition=Symbol("x:y"), description="d"))
    assert _field_counts(encode_frame_all_fields(0, rejected)) == [6, 1, 3]
    assert _field_counts(encode_frame_all_fields(0, detach)) == [3, 3]
    assert _field_counts(encode_frame(0, rejected)) == [5, 1, 1]
