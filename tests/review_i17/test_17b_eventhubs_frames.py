"""Review of issue 17 (Event Hubs) frame by frame over a socket (the raw peer of
tests/servicebus/test_eventhubs_frames.py): a reader with no credit then credit, drain (Part 2 §2.7.6), an event
larger than the peer's max-frame-size, two readers of one partition and consumer group, a bad filter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.amqp.definitions import AmqpValue, Attach, Disposition, Flow, MessageAnnotations, Transfer
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.thread import ThreadedBroker
from tests.servicebus.conftest import sb_broker as sb_broker
from tests.servicebus.test_eventhubs_frames import RawPeer, _opened, _reader, _refused, _sections

pytestmark = pytest.mark.timeout(30)

READER = "hub/ConsumerGroups/$Default/Partitions/0"


@pytest.fixture
def peer(sb_broker: ThreadedBroker) -> Iterator[RawPeer]:
    p = RawPeer(sb_broker.port)
    p.send(frames.open_(hostname="127.0.0.1", max_frame_size=UInt(512)))
    p.send(frames.begin())
    _opened(p)
    yield p
    p.close()


def _send_events(p: RawPeer, *bodies: str) -> None:
    p.send(frames.attach_sender("hub/Partitions/0", 0))
    p.expect(Attach)
    p.expect(Flow)
    for i, body in enumerate(bodies):
        p.send(frames.transfer(0, i, settled=True), frames.message(body))


def _body(payload: bytes) -> object:
    return next(s.value for s in _sections(payload) if isinstance(s, AmqpValue))


def _event(p: RawPeer) -> tuple[object, int]:
    """The next transfer's body and sequence number."""
    transfer, _, payload = p.expect(Transfer)
    assert transfer.settled
    annotations = next(s for s in _sections(payload) if isinstance(s, MessageAnnotations)).value
    return _body(payload), int(annotations["x-opt-sequence-number"])


def test_17b_a_reader_without_credit_gets_nothing_until_it_flows(peer: RawPeer) -> None:
    _send_events(peer, "a", "b", "c")
    peer.send(frames.attach_receiver(READER, 1))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=2, delivery_count=0))  # (also shows nothing came before)
    assert [_event(peer) for _ in range(2)] == [("a", 0), ("b", 1)]
    peer.send(frames.flow(handle=1, link_credit=1, delivery_count=2))
    assert _event(peer) == ("c", 2)


def test_17b_a_draining_reader_gets_its_credit_used_up(peer: RawPeer) -> None:
    """§2.7.6: with drain set the sender uses up the credit, by sending or by advancing delivery-count, and
    answers with a flow; a reader past the partition's end is told so at once rather than left waiting."""
    _send_events(peer, "only")
    peer.send(frames.attach_receiver(READER, 1))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=5, delivery_count=0, drain=True))
    assert _event(peer) == ("only", 0)
    flow, _, _ = peer.expect(Flow)
    assert flow.handle == 1
    assert flow.link_credit == 0
    assert flow.delivery_count == 5


def test_17b_an_event_larger_than_a_frame_arrives_whole(peer: RawPeer) -> None:
    body = "x" * 5_000
    payload = frames.message(body)
    peer.send(frames.attach_sender("hub/Partitions/0", 0))
    peer.expect(Attach)
    peer.expect(Flow)
    pieces = [payload[i : i + 400] for i in range(0, len(payload), 400)]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        peer.send(frames.transfer(0, 0 if i == 0 else None, more=not last), piece)
    disposition, _, _ = peer.expect(Disposition)
    assert disposition.settled
    peer.send(frames.attach_receiver(READER, 1))
    peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=1, delivery_count=0))
    transfer, _, received = peer.expect(Transfer)
    while transfer.more:  # the broker splits it to the peer's max-frame-size (512) in turn
        transfer, _, more = peer.expect(Transfer)
        received += more
    assert _body(received) == body


def test_17b_two_readers_of_one_partition_and_group_each_get_every_event(peer: RawPeer) -> None:
    _send_events(peer, "a", "b")
    for handle in (1, 2):
        peer.send(frames.attach_receiver(READER, handle, name=f"r{handle}"))
        peer.expect(Attach)
    peer.send(frames.flow(handle=1, link_credit=5, delivery_count=0))
    got = [(_event(peer)) for _ in range(2)]
    peer.send(frames.flow(handle=2, link_credit=5, delivery_count=0))
    got += [(_event(peer)) for _ in range(2)]
    assert got == [("a", 0), ("b", 1), ("a", 0), ("b", 1)]


@pytest.mark.parametrize(
    "selector",
    [
        "amqp.annotation.x-opt-offset > '-2'",
        "amqp.annotation.x-opt-offset > '1' OR 1=1",
        "amqp.annotation.x-opt-offset > '\x00'",
        "amqp.annotation.x-opt-enqueued-time > '" + "9" * 40 + "'",
        "",
    ],
)
def test_17b_a_bad_filter_is_refused_with_invalid_field(peer: RawPeer, selector: str) -> None:
    assert _refused(peer, frames.attach_receiver(None, 1, source=_reader(selector))) == "amqp:invalid-field"
    # the connection goes on: a good reader attaches after it
    peer.send(frames.attach_receiver(READER, 2))
    assert peer.expect(Attach)[0].source is not None


@pytest.mark.parametrize(
    "selector",
    [
        "amqp.annotation.x-opt-sequence-number > '5'",
        "amqp.annotation.x-opt-sequence-number > '3'",
        "amqp.annotation.x-opt-sequence-number >= '4'",
        "amqp.annotation.x-opt-offset > '100000'",
    ],
)
def test_17b_a_reader_past_the_partitions_end_is_refused(peer: RawPeer, selector: str) -> None:
    """Event Hubs refuses a reader whose starting sequence number lies past the partition's end ("The supplied
    sequence number '488' is invalid. The last sequence number in the system is '482'": nicolgit/azure-firewall-mon#21,
    Azure/azure-event-hubs-spark#315) with ``com.microsoft:argument-out-of-range``, which azure-eventhub does not
    retry (``_constants.py`` ``NO_RETRY_ERRORS``), rather than have it wait for events that may never come."""
    _send_events(peer, "a", "b", "c")  # sequence numbers 0 to 2
    assert _refused(peer, frames.attach_receiver(None, 1, source=_reader(selector))) == (
        "com.microsoft:argument-out-of-range"
    )


@pytest.mark.parametrize(
    ("selector", "first"),
    [
        ("amqp.annotation.x-opt-sequence-number > '2'", "d"),
        ("amqp.annotation.x-opt-sequence-number >= '3'", "d"),
        ("amqp.annotation.x-opt-sequence-number >= '2'", "c"),
    ],
)
def test_17b_a_reader_at_the_partitions_end_waits_for_the_next_event(peer: RawPeer, selector: str, first: str) -> None:
    _send_events(peer, "a", "b", "c")
    peer.send(frames.attach_receiver(None, 1, source=_reader(selector)))
    assert peer.expect(Attach)[0].source is not None
    peer.send(frames.flow(handle=1, link_credit=5, delivery_count=0))
    peer.send(frames.transfer(0, 3, settled=True), frames.message("d"))
    assert _event(peer)[0] == first
