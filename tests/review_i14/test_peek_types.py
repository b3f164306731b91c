"""Peek must encode every AMQP value as JSON (never a 500): exotic property types, and bodies of every shape."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from proton import Message, symbol, timestamp, ulong
from proton.utils import BlockingConnection

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpSequence, AmqpValue, Data, Flow, Properties
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def test_every_property_type_is_json(broker: ThreadedBroker) -> None:
    conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)
    try:
        message = Message(
            id=uuid.UUID(int=7),
            correlation_id=ulong(9),
            subject="s",
            body={symbol("k"): [timestamp(1_700_000_000_000), uuid.UUID(int=1), b"\x00\xff", 1.5]},
            properties={"t": timestamp(5), "u": uuid.uuid4(), "sym": symbol("x"), "bin": b"\x00"},
            annotations={symbol("x-opt-a"): {"nested": [1, 2]}},
            creation_time=1_700_000_000.5,
        )
        conn.create_sender("typed").send(message)
    finally:
        conn.close()
    answer = call(broker, "GET", "/api/queues/typed/messages")
    assert answer.status == 200, answer.body
    (item,) = answer.json
    assert item["properties"]["message_id"] == str(uuid.UUID(int=7))


@pytest.mark.parametrize(
    "sections",
    [
        [Data(b"a"), Data(b"\xff")],
        [AmqpSequence([1, "two"]), AmqpSequence([b"\x00"])],
        [AmqpValue(None)],
        [Properties(message_id=b"\x01\x02", user_id=b"\xff")],
    ],
)
def test_bodies_of_every_shape_are_json(broker: ThreadedBroker, sections: list[object]) -> None:
    host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        peer.open()
        peer.begin()
        peer.attach_sender("shapes", 0, name="s")
        peer.expect(Flow)
        payload = b"".join(codec.encode(section) for section in sections)
        peer.transfer(0, 0, payload, settled=True)
    broker.wait_for(lambda: broker.queue("shapes").depth == 1)
    answer = call(broker, "GET", "/api/queues/shapes/messages")
    assert answer.status == 200, answer.body
