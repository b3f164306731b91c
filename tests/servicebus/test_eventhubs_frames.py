"""Event Hubs (issue 17 item 10) frame by frame over a socket: performatives with every field in the ``servicebus``
personality, the ``$management`` READ answers, partition links and their refusals; then the pure parts."""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    ApplicationProperties,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    Flow,
    MessageAnnotations,
    Open,
    Properties,
    Source,
    Transfer,
)
from minibroker.amqp.fastpath import decode_performative, encode_transfer, encode_transfer_all_fields
from minibroker.amqp.framing import AMQP_HEADER, encode_frame
from minibroker.amqp.types import Described, Symbol
from minibroker.broker.eventhubs import RETENTION, Partition
from minibroker.broker.message import Message
from minibroker.servicebus import eventhubs as eh
from minibroker.testing import frames
from minibroker.testing.thread import ThreadedBroker, run_in_thread

pytestmark = pytest.mark.timeout(30)

_SIZE = struct.Struct(">I")


class RawPeer:
    """A client over a socket that keeps each frame's bytes, to count the fields the broker encoded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.sock.sendall(AMQP_HEADER)
        assert self._read(8) == AMQP_HEADER

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "the broker closed the connection"
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def send(self, performative: Any, payload: bytes = b"", channel: int = 0) -> None:
        self.sock.sendall(encode_frame(channel, performative, payload))

    def body(self) -> bytes:
        """The next frame's body (heartbeats skipped)."""
        while True:
            size = _SIZE.unpack(self._read(4))[0]
            rest = self._read(size - 4)
            if size > 8:
                return rest[4:]

    def expect(self, kind: type[Any]) -> tuple[Any, int, bytes]:
        """The next frame's performative (a ``kind``), how many fields it was encoded with, and its payload."""
        body = self.body()
        performative, end = decode_performative(body)
        assert isinstance(performative, kind), performative
        return performative, field_count(body), body[end:]

    def close(self) -> None:
        self.sock.close()


def field_count(body: bytes) -> int:
    """The number of fields in the described list a frame body starts with (§1.6.22-24 list encodings)."""
    assert body[:2] == b"\x00\x53", body[:4]
    constructor = body[3]
    if constructor == 0x45:
        return 0
    if constructor == 0xC0:
        return body[5]
    assert constructor == 0xD0
    return int(_SIZE.unpack(body[8:12])[0])


@pytest.fixture
def peer(sb_broker: ThreadedBroker) -> Iterator[RawPeer]:
    p = RawPeer(sb_broker.port)
    p.send(frames.open_(hostname="127.0.0.1"))
    p.send(frames.begin())
    yield p
    p.close()


def _opened(p: RawPeer) -> None:
    assert p.expect(Open)[1] == len(Open.FIELDS)
    assert p.expect(Begin)[1] == len(Begin.FIELDS)


def _reader(selector: str | None) -> Source:
    filters = None
    if selector is not None:
        filters = {Symbol(eh.SELECTOR_FILTER): Described(Symbol(eh.SELECTOR_FILTER), selector)}
    return Source(address="amqps://127.0.0.1/hub/ConsumerGroups/$Default/Partitions/0", filter=filters)


def test_servicebus_performatives_carry_every_field(peer: RawPeer) -> None:
    """azure-eventhub 5.x ``_pyamqp/_decode.py`` ``decode_frame`` pads no short list: open, begin, attach, flow,
    transfer, disposition, detach and close all go out whole (trailing nulls included)."""
    _opened(peer)
    peer.send(frames.attach_sender("amqps://127.0.0.1/hub/Partitions/0", 0))
    assert peer.expect(Attach)[1] == len(Attach.FIELDS)
    assert peer.expect(Flow)[1] == len(Flow.FIELDS)
    peer.send(frames.transfer(0, 0), frames.message("first"))
    disposition, count, _ = peer.expect(Disposition)
    assert (count, disposition.settled) == (len(Disposition.FIELDS), True)
    peer.send(frames.attach_receiver(None, 1, source=_reader(None)))
    assert peer.expect(Attach)[1] == len(Attach.FIELDS)
    peer.send(frames.flow(handle=1, link_credit=10, delivery_count=0))
    transfer, count, payload = peer.expect(Transfer)
    assert (count, transfer.settled) == (len(Transfer.FIELDS), True)
    annotations = next(s for s in _sections(payload) if isinstance(s, MessageAnnotations)).value
    assert (annotations["x-opt-sequence-number"], annotations["x-opt-offset"]) == (0, "0")
    assert [s.value for s in _sections(payload) if isinstance(s, AmqpValue)] == ["first"]
    peer.send(Detach(handle=frames.UInt(1), closed=True))
    assert peer.expect(Detach)[1] == len(Detach.FIELDS)
    peer.send(Close())
    assert peer.expect(Close)[1] == len(Close.FIELDS)


def test_other_personalities_trim_trailing_nulls() -> None:
    """The choice is the personality's: the default one still trims (§1.4 lets it), costing nothing."""
    with run_in_thread({"server": {"port": 0}}) as broker:
        p = RawPeer(broker.port)
        p.send(frames.open_())
        assert p.expect(Open)[1] < len(Open.FIELDS)
        p.close()


def _sections(payload: bytes) -> list[Any]:
    found, pos = [], 0
    while pos < len(payload):
        section, pos = codec.decode(payload, pos)
        found.append(section)
    return found


def _read(p: RawPeer, handle: int, **application: Any) -> tuple[dict[Any, Any], Any]:
    """Send a READ with ``application`` properties on the request link; the answer's (application-properties,
    body)."""
    message_id = uuid.uuid4()
    request = codec.encode(Properties(message_id=message_id, reply_to="$management")) + codec.encode(
        ApplicationProperties({"operation": "READ", **application})
    )
    p.send(frames.transfer(0, handle, settled=True), request + codec.encode(AmqpValue(None)))
    _, _, payload = p.expect(Transfer)
    sections = _sections(payload)
    properties = next(s for s in sections if isinstance(s, Properties))
    assert properties.correlation_id == message_id
    found = next(s for s in sections if isinstance(s, ApplicationProperties)).value
    return found, next(s for s in sections if isinstance(s, AmqpValue)).value


@pytest.fixture
def management(peer: RawPeer) -> RawPeer:
    _opened(peer)
    peer.send(frames.attach_sender("$management", 0, "mgmt-req"))
    peer.expect(Attach)
    peer.expect(Flow)
    peer.send(frames.attach_receiver("$management", 1, "mgmt-resp", target=None))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=10, delivery_count=0))
    return peer


def test_read_of_a_hub(management: RawPeer) -> None:
    """``_client_base.py`` ``_get_eventhub_properties``: status under ``status-code``, the body a map."""
    status, value = _read(management, 0, type=eh.HUB_TYPE, name="orders-hub")
    assert (status["status-code"], status["status-description"]) == (200, "OK")
    assert (value["name"], value["partition_count"], value["partition_ids"]) == ("orders-hub", 2, ["0", "1"])
    assert value["created_at"] > 0


def test_read_of_a_partition(management: RawPeer) -> None:
    status, value = _read(management, 0, type=eh.PARTITION_TYPE, name="orders-hub", partition="1")
    assert status["status-code"] == 200
    assert value == {
        "name": "orders-hub",
        "type": eh.PARTITION_TYPE,
        "partition": "1",
        "begin_sequence_number": 0,
        "last_enqueued_sequence_number": -1,
        "last_enqueued_offset": "-1",
        "last_enqueued_time_utc": 0,
        "is_partition_empty": True,
    }


@pytest.mark.parametrize(
    ("application", "code"),
    [
        ({"type": eh.PARTITION_TYPE, "name": "h", "partition": "2"}, 404),  # partitions are 0 and 1
        ({"type": eh.PARTITION_TYPE, "name": "h", "partition": 0}, 404),  # an id is a string
        ({"type": eh.PARTITION_TYPE, "name": "h"}, 404),
        ({"type": eh.HUB_TYPE}, 400),  # no name
        ({"type": eh.HUB_TYPE, "name": "a\x00b"}, 400),
        ({"type": eh.HUB_TYPE, "name": "a/b"}, 400),
        ({"type": eh.HUB_TYPE, "name": "x" * 300}, 400),
        ({"type": "com.microsoft:queue", "name": "h"}, 400),
        ({"name": "h"}, 400),
    ],
)
def test_bad_reads_get_a_status(management: RawPeer, application: dict[str, Any], code: int) -> None:
    status, value = _read(management, 0, **application)
    assert status["status-code"] == code
    assert value is None


def _refused(p: RawPeer, attach: Attach) -> str:
    """Attach; the broker answers with a null terminus and detaches: the error's condition."""
    p.send(attach)
    answer = p.expect(Attach)[0]
    assert (answer.source if attach.role else answer.target) is None
    detach = p.expect(Detach)[0]
    assert detach.error is not None
    return str(detach.error.condition)


@pytest.mark.parametrize(
    ("attach", "condition"),
    [
        (frames.attach_receiver("hub/ConsumerGroups/$Default/Partitions/2"), "amqp:not-found"),
        (frames.attach_sender("hub/Partitions/-1"), "amqp:not-found"),
        (frames.attach_receiver(None, source=_reader("amqp.annotation.x-opt-offset > 5")), "amqp:invalid-field"),
        (frames.attach_receiver(None, source=_reader("x-opt-offset > '5'")), "amqp:invalid-field"),
        (
            frames.attach_receiver(None, source=_reader("amqp.annotation.x-opt-sequence-number > 'ten'")),
            "amqp:invalid-field",
        ),
        (
            frames.attach_receiver(None, source=_reader(f"amqp.annotation.x-opt-sequence-number > '{1 << 64}'")),
            "amqp:invalid-field",
        ),
        (frames.attach_receiver("hub/Partitions/0"), "amqp:not-allowed"),  # events are read through a group
        (frames.attach_sender("hub/ConsumerGroups/$Default/Partitions/0"), "amqp:not-allowed"),
    ],
)
def test_bad_partition_links_are_refused(peer: RawPeer, attach: Attach, condition: str) -> None:
    _opened(peer)
    assert _refused(peer, attach) == condition


def test_a_reader_at_latest_gets_only_new_events(peer: RawPeer) -> None:
    _opened(peer)
    peer.send(frames.attach_sender("hub/Partitions/0", 0))
    peer.expect(Attach)
    peer.expect(Flow)
    peer.send(frames.transfer(0, 0), frames.message("old"))
    peer.expect(Disposition)
    peer.send(frames.attach_receiver(None, 1, source=_reader("amqp.annotation.x-opt-offset > '@latest'")))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=10, delivery_count=0))
    peer.send(frames.transfer(0, 1), frames.message("new"))
    peer.expect(Disposition)
    _, _, payload = peer.expect(Transfer)
    assert [s.value for s in _sections(payload) if isinstance(s, AmqpValue)] == ["new"]


# -- pure parts ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("hub/Partitions/0", eh.EventHubAddress("hub", "0")),
        ("hub/ConsumerGroups/cg/Partitions/1", eh.EventHubAddress("hub", "1", "cg")),
        ("hub", None),
        ("hub/Partitions", None),
        ("hub/Subscriptions/s", None),
        ("hub/ConsumerGroups/cg/Partitions/1/extra", None),
        ("/Partitions/0", None),
        ("h\x00b/Partitions/0", None),
    ],
)
def test_parse_address(path: str, expected: eh.EventHubAddress | None) -> None:
    assert eh.parse_address(path) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, eh.START),
        ("amqp.annotation.x-opt-offset > '-1'", eh.Position("offset", -1)),
        ("amqp.annotation.x-opt-offset >= '96'", eh.Position("offset", 96, inclusive=True)),
        ("amqp.annotation.x-opt-offset > '@latest'", eh.Position(latest=True)),
        ("amqp.annotation.x-opt-sequence-number > '3'", eh.Position("sequence", 3)),
        ("amqp.annotation.x-opt-enqueued-time > '1700000000000'", eh.Position("enqueued", 1700000000000)),
    ],
)
def test_parse_position(text: str | None, expected: eh.Position) -> None:
    assert eh.parse_position(text) == expected


@pytest.mark.parametrize(
    "text", [b"bytes", 5, "", "amqp.annotation.x-opt-offset < '3'", "amqp.annotation.x-opt-offset > '-2'"]
)
def test_unreadable_positions(text: object) -> None:
    assert isinstance(eh.parse_position(text), str)


def test_a_partition_keeps_its_newest_events() -> None:
    partition = Partition("hub", "0")
    for _ in range(RETENTION + 5):
        partition.append(Message(frames.message("e")), 1000)
    state = partition.state()
    assert (state.begin_sequence_number, state.last_sequence_number) == (5, RETENTION + 4)
    assert partition.start(eh.START) == 5
    assert partition.start(eh.Position("sequence", 1)) == 5  # dropped ones are gone: the oldest kept


@pytest.mark.parametrize(
    "args",
    [
        (0, 0, b"t", 0, True, False, None),
        (3, 70000, b"tag", 0x80013700, False, True, None),
        (1, None, None, None, None, True, None),
        (1, None, None, None, None, False, None),
        (2, 5, b"x" * 300, 0, False, False, Accepted()),  # past 255 bytes: the list32 encoding
    ],
)
def test_transfer_with_every_field_decodes_as_the_trimmed_one(args: tuple[Any, ...]) -> None:
    whole = encode_transfer_all_fields(*args)
    assert field_count(whole) == len(Transfer.FIELDS)
    trimmed = codec.decode(encode_transfer(*args))[0]
    assert codec.decode(whole) == (trimmed, len(whole))


def test_composites_with_every_field_decode_alike() -> None:
    attach = frames.attach_sender("hub/Partitions/0", 3)
    buf = bytearray()
    attach.encode_all_into(buf)
    assert field_count(bytes(buf)) == len(Attach.FIELDS)
    assert codec.decode(bytes(buf))[0] == attach


def test_a_reader_held_back_by_a_slow_peer_goes_on(peer: RawPeer) -> None:
    """Past 1 MiB queued for the peer the broker holds deliveries back; once the peer has read them, the reader's
    remaining events go out (the broker resumes it, with no new flow from the peer)."""
    _opened(peer)
    peer.send(frames.attach_sender("hub/Partitions/1", 0))
    peer.expect(Attach)
    peer.expect(Flow)
    count, body = 150, "e" * 10_000  # 1.5 MB in all
    for i in range(count):
        peer.send(frames.transfer(0, i, settled=True), frames.message(body))
    peer.send(frames.attach_receiver("hub/ConsumerGroups/g/Partitions/1", 1))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=count, delivery_count=0))
    numbers = []
    while len(numbers) < count:
        _, _, payload = peer.expect(Transfer)
        annotations = next(s for s in _sections(payload) if isinstance(s, MessageAnnotations)).value
        numbers.append(annotations["x-opt-sequence-number"])
    assert numbers == list(range(count))
