"""Message content survives the broker: every body kind, every bare-message section, and the exact bytes."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from proton import Delivery, Described, Message, char, symbol, timestamp, ubyte, ulong
from proton.reactor import Container

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import (
    Scenario,
    as_bytes,
    blocking_connection,
    encode,
    queue_stats,
    receive_raw,
    run,
    section,
    send_raw,
)

BODIES = [
    pytest.param("hello, broker", False, id="string"),
    pytest.param("h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \U0001f389", False, id="unicode"),
    pytest.param(b"\x00\x01binary\xff\xfe", False, id="binary-value"),
    pytest.param(b"\x00\x01data section\xff", True, id="data-section"),
    pytest.param(b"", True, id="empty-data-section"),
    pytest.param({"a": 1, "nested": {"b": [1, 2]}, symbol("k"): None, "s": "t"}, False, id="map"),
    pytest.param([1, "two", 3.5, None, True, [4]], False, id="list"),
    pytest.param([1, "two", {"three": 3}], True, id="amqp-sequence"),
    pytest.param(None, False, id="none"),
    pytest.param(42, False, id="int"),
    pytest.param(-(2**63), False, id="long-min"),
    pytest.param(2.5, False, id="double"),
    pytest.param(True, False, id="bool"),
    pytest.param(uuid.UUID("12345678-1234-5678-1234-567812345678"), False, id="uuid"),
    pytest.param(symbol("a-symbol"), False, id="symbol"),
    pytest.param(char("x"), False, id="char"),
    pytest.param(timestamp(1_700_000_000_123), False, id="timestamp"),
    pytest.param(ulong(2**64 - 1), False, id="ulong-max"),
    pytest.param(Described(symbol("com.example:point"), [3, 4]), False, id="described"),
]


@pytest.mark.parametrize(("body", "inferred"), BODIES)
def test_body_round_trip(broker: ThreadedBroker, body: Any, inferred: bool) -> None:
    with blocking_connection(broker) as conn:
        sender = conn.create_sender("bodies")
        sender.send(Message(body=body, inferred=inferred))
        receiver = conn.create_receiver("bodies")
        received = receiver.receive()
        receiver.accept()

    got = received.body
    if isinstance(body, bytes):
        assert as_bytes(got) == body  # proton hands binary out as a memoryview
    else:
        assert got == body
        assert type(got) is type(body)
    assert received.inferred == inferred


def test_bare_message_sections_preserved(broker: ThreadedBroker) -> None:
    created = datetime.datetime(2024, 5, 17, 12, 30, tzinfo=datetime.UTC).timestamp()
    message = Message(
        body={"order": 7},
        # header
        durable=True,
        priority=7,
        ttl=600.0,
        first_acquirer=True,
        delivery_count=2,
        # properties
        id=uuid.UUID("00000000-0000-0000-0000-00000000abcd"),
        user_id=b"anonymous",
        address="props",
        subject="order.created",
        reply_to="replies",
        correlation_id=ulong(99),
        content_type="application/json",
        content_encoding="utf-8",
        expiry_time=created + 100 * 365 * 86400,  # far ahead: an expired message would (rightly) never arrive
        creation_time=created,
        group_id="group-1",
        group_sequence=5,
        reply_to_group_id="reply-group",
        # delivery annotations, message annotations, application properties
        instructions={symbol("x-opt-instruction"): "hint"},
        annotations={symbol("x-opt-partition-key"): "p1", symbol("x-opt-sequence"): 12},
        properties={"region": "eu", "count": 3, "ratio": 0.5, "flag": False, "bin": b"\x01\x02"},
    )
    with blocking_connection(broker) as conn:
        conn.create_sender("props").send(message)
        receiver = conn.create_receiver("props")
        got = receiver.receive()
        receiver.accept()

    assert (got.durable, got.priority, got.ttl, got.first_acquirer) == (True, 7, 600.0, True)
    assert got.delivery_count == 2
    assert got.id == message.id
    assert bytes(got.user_id) == b"anonymous"
    assert got.address == "props"
    assert got.subject == "order.created"
    assert got.reply_to == "replies"
    assert got.correlation_id == 99  # proton decodes a ulong message-id as a plain int
    assert got.content_type == "application/json"
    assert got.content_encoding == "utf-8"
    assert got.creation_time == created
    assert got.expiry_time == created + 100 * 365 * 86400
    assert got.group_id == "group-1"
    assert got.group_sequence == 5
    assert got.reply_to_group_id == "reply-group"
    assert got.instructions == {"x-opt-instruction": "hint"}
    assert got.annotations == {"x-opt-partition-key": "p1", "x-opt-sequence": 12}
    assert got.properties == {"region": "eu", "count": 3, "ratio": 0.5, "flag": False, "bin": b"\x01\x02"}
    assert got.body == {"order": 7}


@pytest.mark.parametrize(
    "correlation_id",
    [
        pytest.param("corr-string", id="string"),
        pytest.param(uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), id="uuid"),
        pytest.param(ulong(12345), id="ulong"),
        pytest.param(b"\xde\xad\xbe\xef", id="binary"),
    ],
)
def test_message_and_correlation_id_kinds(broker: ThreadedBroker, correlation_id: Any) -> None:
    with blocking_connection(broker) as conn:
        conn.create_sender("ids").send(Message(id=correlation_id, correlation_id=correlation_id, body="x"))
        receiver = conn.create_receiver("ids")
        got = receiver.receive()
        receiver.accept()
    for value in (got.id, got.correlation_id):
        if isinstance(correlation_id, bytes):
            assert as_bytes(value) == correlation_id
        else:
            assert value == correlation_id  # (proton decodes a ulong id as a plain int: types differ)


# -- byte-exact preservation ------------------------------------------------------------------------------
def _payloads() -> list[bytes]:
    rich = Message(
        id="m-1",
        subject="s",
        durable=True,
        priority=9,
        ttl=5.0,
        creation_time=1_700_000_000.5,
        annotations={symbol("x-opt-a"): 1},
        properties={"k": "v", "n": 7},
        body={"nested": [1, 2, {"x": None}]},
    )
    return [
        encode(rich),
        encode(Message(body="plain")),
        encode(Message(body=b"\x00" * 100 + b"\xff" * 100, inferred=True)),
        encode(Message(body=[1, 2, 3], inferred=True, delivery_count=3)),
        # no header at all: the message starts with its properties section
        section(0x73, [symbol("no-header")]) + section(0x77, "value"),
        # delivery annotations, two data sections and a footer (proton's Message cannot express these)
        section(0x70, [True, ubyte(4)])
        + section(0x71, {symbol("x-opt-delivery"): "d"})
        + section(0x72, {symbol("x-opt-message"): "m"})
        + section(0x74, {"app": 1})
        + section(0x75, b"part one, ")
        + section(0x75, b"part two")
        + section(0x78, {symbol("x-opt-footer"): "f"}),
        # large enough to span many frames both ways
        encode(Message(body=bytes(range(256)) * 1200, inferred=True, properties={"big": True})),
    ]


class ByteExactRoundTrip(Scenario):
    """Send encoded messages as raw bytes; collect the raw payloads the consumer receives."""

    def __init__(self, url: str, payloads: list[bytes]) -> None:
        super().__init__(url, raw_receive=True)
        self.payloads = payloads
        self.to_send = list(payloads)
        self.received: list[bytes] = []

    def setup(self, container: Container) -> None:
        conn = self.connect()
        container.create_sender(conn, "exact")
        container.create_receiver(conn, "exact")

    def on_sendable(self, event: Any) -> None:
        while self.to_send and event.sender.credit:
            send_raw(event.sender, self.to_send.pop(0))

    def on_delivery(self, event: Any) -> None:
        if event.link.is_sender:
            return  # the broker settling what we sent
        payload = receive_raw(event)
        if payload is None:
            return
        self.received.append(payload)
        event.delivery.update(Delivery.ACCEPTED)
        event.delivery.settle()
        if len(self.received) == len(self.payloads):
            self.finish()

    def describe(self) -> str:
        return f"received {len(self.received)} of {len(self.payloads)}"


def test_payload_bytes_are_preserved_exactly(broker: ThreadedBroker) -> None:
    payloads = _payloads()
    scenario = ByteExactRoundTrip(broker.url, payloads)
    run(scenario)
    assert len(scenario.received) == len(payloads)
    for sent, got in zip(payloads, scenario.received, strict=True):
        assert got == sent
    # and proton agrees each one is a well-formed message
    for got in scenario.received:
        Message().decode(got)
    assert queue_stats(broker, "exact") == (0, 0)
