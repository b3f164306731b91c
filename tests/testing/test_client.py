"""The sans-IO client core (``minibroker.testing.client``) fed with bytes, as a user's frame-level test feeds it.

Each test plays the broker by hand (frames built with ``minibroker.testing.frames``, encoded by the broker's own
encoder) and checks what ``ClientConnection`` makes of them: the events, and the bookkeeping the specification
makes a client keep (Part 2 §2.5.6 session windows, §2.6.7 link credit, §2.6.12-14 multi-frame, aborted and
settled deliveries, Part 5 §5.3 SASL). Property tests check the parser (any bytes: events or ``ProtocolError``,
nothing else; any split of a valid stream: the same events) and, against the broker's engine, the credit
bookkeeping of both link directions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minibroker.amqp.definitions import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER, encode_frame
from minibroker.amqp.types import Symbol, UByte, UInt
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import LinkAttached
from minibroker.testing import frames
from minibroker.testing.client import (
    RECEIVER,
    SENDER,
    ClientConnection,
    Delivery,
    Ended,
    Event,
    Frame,
    Link,
    ProtocolError,
    ProtocolHeader,
    parse_frames,
    split_header,
)
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

U32 = 2**32


# -- helpers: the broker's side, by hand -------------------------------------------------------------------
def drain(conn: ClientConnection) -> list[Event]:
    """Every event ``conn`` has ready (stopping at ``Ended``)."""
    found: list[Event] = []
    while (event := conn.next_event()) is not None:
        found.append(event)
        if isinstance(event, Ended):
            break
    return found


def feed(conn: ClientConnection, *chunks: bytes) -> list[Event]:
    """Feed the broker's bytes; the events they make."""
    data = b"".join(chunks)
    if data:
        conn.receive_data(data)
    return drain(conn)


def end_stream(conn: ClientConnection) -> list[Event]:
    """The broker closes the byte stream; the events left."""
    conn.receive_data(b"")
    return drain(conn)


def feed_frames(conn: ClientConnection, *chunks: bytes) -> list[Frame]:
    events = feed(conn, *chunks)
    assert all(isinstance(e, Frame) for e in events), events
    return [e for e in events if isinstance(e, Frame)]


def bframe(channel: int, performative: Any, payload: bytes = b"") -> bytes:
    return encode_frame(channel, performative, payload)


def connected(
    *,
    channel: int = 0,
    remote_channel: int = 0,
    next_outgoing_id: int = 0,
    window: int = 2048,
    broker_next_outgoing_id: int = 0,
    broker_window: int = 2048,
) -> ClientConnection:
    """A connection that exchanged headers and opens and began one session (ours ``channel``, the broker's
    ``remote_channel``)."""
    conn = ClientConnection()
    conn.send_header(AMQP_HEADER)
    conn.send(frames.open_())
    conn.send(frames.begin(next_outgoing_id=next_outgoing_id, incoming_window=window), channel)
    conn.data_to_send()
    events = feed(
        conn,
        AMQP_HEADER,
        bframe(0, Open(container_id="broker")),
        bframe(
            remote_channel,
            Begin(
                remote_channel=channel,
                next_outgoing_id=broker_next_outgoing_id,
                incoming_window=broker_window,
                outgoing_window=2048,
            ),
        ),
    )
    assert [type(e) for e in events] == [ProtocolHeader, Frame, Frame]
    return conn


def broker_attach(name: str, handle: int, role: bool, *, initial: int | None = None) -> Attach:
    """The broker's attach: ``role`` is the broker's (the opposite of ours for the same link)."""
    return Attach(
        name=name,
        handle=handle,
        role=role,
        source=Source(address="q"),
        target=Target(address="q"),
        initial_delivery_count=(0 if initial is None else initial) if role == SENDER else None,
    )


def receiver(
    conn: ClientConnection,
    *,
    handle: int = 0,
    remote_handle: int = 0,
    name: str = "r",
    credit: int = 0,
    initial: int = 0,
    channel: int = 0,
    remote_channel: int = 0,
) -> Link:
    """Our receiver link, attached both ways; ``credit`` granted with a flow of ours."""
    conn.send(frames.attach_receiver("q", handle, name), channel)
    feed_frames(conn, bframe(remote_channel, broker_attach(name, remote_handle, SENDER, initial=initial)))
    if credit:
        conn.send(conn.flow(handle, credit, channel=channel), channel)
    conn.data_to_send()
    return conn.session(channel).links[handle]


def sender(
    conn: ClientConnection,
    *,
    handle: int = 0,
    remote_handle: int = 0,
    name: str = "s",
    credit: int = 0,
    channel: int = 0,
    remote_channel: int = 0,
) -> Link:
    """Our sender link, attached both ways; ``credit`` granted by a broker flow."""
    conn.send(frames.attach_sender("q", handle, name), channel)
    feed_frames(conn, bframe(remote_channel, broker_attach(name, remote_handle, RECEIVER)))
    if credit:
        session = conn.session(channel)
        flow = frames.flow(
            next_incoming_id=session.next_outgoing_id,
            incoming_window=session.remote_incoming_window,
            handle=remote_handle,
            delivery_count=session.links[handle].delivery_count,
            link_credit=credit,
        )
        feed_frames(conn, bframe(remote_channel, flow))
    conn.data_to_send()
    return conn.session(channel).links[handle]


def btransfer(handle: int, delivery_id: int | None, payload: bytes = b"m", *, channel: int = 0, **fields: Any) -> bytes:
    return bframe(channel, frames.transfer(handle, delivery_id, **fields), payload)


def delivery_of(events: list[Event]) -> Delivery:
    (event,) = events
    assert isinstance(event, Frame), event
    assert event.delivery is not None, event
    return event.delivery


# -- parsing: headers and frames (§2.2, §2.3) ---------------------------------------------------------------
def test_header_then_frames_then_end_of_stream() -> None:
    conn = ClientConnection()
    events = feed(conn, AMQP_HEADER, bframe(0, Open(container_id="b")), frames.heartbeat(), bframe(0, Close()))
    assert events[0] == ProtocolHeader(AMQP_HEADER)
    assert [type(e.performative) for e in events[1:] if isinstance(e, Frame)] == [Open, type(None), Close]
    assert isinstance(events[2], Frame)
    assert events[2].is_heartbeat
    assert conn.remote_open == Open(container_id="b")
    assert conn.remote_close == Close()
    assert conn.next_event() is None
    assert end_stream(conn) == [Ended(0)]


def test_anything_after_the_brokers_close_is_a_violation() -> None:
    """§2.4.3: the close frame "MUST be the last thing ever written onto a connection"."""
    conn = connected()
    feed(conn, bframe(0, Close()))
    assert conn.violations == []
    feed(conn, frames.heartbeat())
    assert conn.violations
    assert "after the broker's close" in conn.violations[0]


def test_end_of_stream_reports_the_bytes_of_an_unfinished_frame() -> None:
    conn = ClientConnection()
    whole = bframe(0, Open(container_id="b"))
    assert feed(conn, AMQP_HEADER, whole[:5]) == [ProtocolHeader(AMQP_HEADER)]
    assert end_stream(conn) == [Ended(5)]


def test_a_frame_split_at_every_byte_boundary_parses_once_whole() -> None:
    stream = AMQP_HEADER + bframe(0, Open(container_id="b")) + frames.heartbeat() + bframe(0, Close())
    whole = drain_all(stream)
    for cut in range(len(stream) + 1):
        conn = ClientConnection()
        assert feed(conn, stream[:cut]) + feed(conn, stream[cut:]) == whole, cut
    one_by_one = ClientConnection()
    events: list[Event] = []
    for byte in stream:
        events += feed(one_by_one, bytes([byte]))
    assert events == whole


def drain_all(stream: bytes) -> list[Event]:
    conn = ClientConnection()
    return feed(conn, stream)


def test_an_extended_frame_header_is_skipped() -> None:
    """§2.3.1: doff > 2 means an extended header sits between the 8 header bytes and the body."""
    body = encode_frame(0, Open(container_id="b"))[8:]
    extended = frames.raw_frame(doff=4, body=b"\xee" * 8 + body)
    conn = ClientConnection()
    events = feed(conn, AMQP_HEADER, extended, frames.raw_frame(doff=3, body=b"\x01\x02\x03\x04"))
    assert isinstance(events[1], Frame)
    assert events[1].performative == Open(container_id="b")
    assert isinstance(events[2], Frame)
    assert events[2].is_heartbeat


@pytest.mark.parametrize(
    "bad",
    [
        frames.raw_frame(size=7),
        frames.raw_frame(doff=1),
        frames.raw_frame(doff=3),  # the data offset lies beyond the frame
        frames.undecodable_frame(),
    ],
)
def test_bytes_that_are_not_a_frame_raise_protocol_error(bad: bytes) -> None:
    conn = ClientConnection()
    feed(conn, AMQP_HEADER)
    with pytest.raises(ProtocolError):
        feed(conn, bad)
    assert issubclass(ProtocolError, ValueError)


def test_a_frame_over_our_max_frame_size_raises_at_its_header() -> None:
    """§2.7.1 open, max-frame-size: the broker MUST NOT send larger frames; the reader says so at the header
    instead of waiting for bytes that a broken broker would never send."""
    conn = ClientConnection()
    conn.send_header(AMQP_HEADER)
    conn.send(frames.open_(max_frame_size=UInt(512)))
    largest = bframe(0, Close(), b"x" * (512 - len(bframe(0, Close()))))
    assert len(largest) == 512
    assert len(feed(conn, AMQP_HEADER, largest)) == 2
    with pytest.raises(ProtocolError, match="max-frame-size"):
        feed(conn, frames.raw_frame(size=513)[:8])


def test_parse_frames_and_split_header() -> None:
    stream = AMQP_HEADER + bframe(1, End()) + frames.heartbeat(2)
    header, rest = split_header(stream)
    assert header == AMQP_HEADER
    assert [(f.channel, f.performative) for f in parse_frames(rest)] == [(1, End()), (2, None)]
    with pytest.raises(ProtocolError):
        parse_frames(rest[:-1])
    with pytest.raises(ProtocolError):
        split_header(b"HTTP/1.1 400")


# -- SASL (Part 5 §5.3) -------------------------------------------------------------------------------------
def sasl_start(code: int) -> ClientConnection:
    conn = ClientConnection()
    conn.send_header(SASL_HEADER)
    events = feed(
        conn,
        SASL_HEADER,
        encode_frame(0, SaslMechanisms(sasl_server_mechanisms=[Symbol("ANONYMOUS")]), frame_type=SASL_FRAME),
        encode_frame(0, SaslOutcome(code=UByte(code)), frame_type=SASL_FRAME),
    )
    assert [type(e) for e in events] == [ProtocolHeader, Frame, Frame]
    assert conn.sasl_outcome == SaslOutcome(code=UByte(code))
    return conn


def test_after_a_successful_sasl_outcome_the_amqp_header_follows() -> None:
    conn = sasl_start(0)
    events = feed(conn, AMQP_HEADER, bframe(0, Open(container_id="b")))
    assert events[0] == ProtocolHeader(AMQP_HEADER)
    assert isinstance(events[1], Frame)
    assert isinstance(events[1].performative, Open)


def test_after_a_failed_sasl_outcome_no_header_is_read() -> None:
    """§5.3.2: a failed outcome ends the SASL exchange with no next layer: the broker closes the connection, so
    whatever else it sent is read as what it is (here an empty frame), not as a protocol header."""
    conn = sasl_start(1)
    events = feed(conn, frames.heartbeat()) + end_stream(conn)
    assert isinstance(events[0], Frame), events
    assert events[0].is_heartbeat
    assert events[1:] == [Ended(0)]


def test_frames_of_the_wrong_layer_are_violations() -> None:
    """Part 5 §5.3.2: between the SASL header and the outcome come SASL frames (type 1); after the AMQP header,
    AMQP frames (type 0, §2.3.2). An outcome in an AMQP frame does not end the SASL layer."""
    conn = ClientConnection()
    feed(conn, SASL_HEADER, bframe(0, SaslOutcome(code=UByte(0))))
    assert conn.violations
    assert "SASL" in conn.violations[0]
    assert not conn.reader.header_next
    conn = sasl_start(0)
    assert conn.violations == []
    feed(conn, AMQP_HEADER, encode_frame(0, Open(container_id="b"), frame_type=SASL_FRAME))
    assert conn.violations
    assert "SASL frame" in conn.violations[0]


# -- sessions (§2.5) ----------------------------------------------------------------------------------------
def test_a_begin_answered_on_another_channel() -> None:
    conn = connected(channel=3, remote_channel=7)
    assert conn.remote_channels == {3: 7}
    link = receiver(conn, channel=3, remote_channel=7, credit=1)
    (frame,) = feed_frames(conn, btransfer(0, 0, b"x", channel=7))
    assert frame.channel == 7
    assert frame.link is link
    assert frame.delivery is not None
    assert frame.delivery.channel == 3
    assert frame.delivery.complete
    assert conn.violations == []


def test_a_transfer_on_a_channel_with_no_session_is_a_violation() -> None:
    conn = connected()
    (frame,) = feed_frames(conn, btransfer(0, 0, channel=5))
    assert frame.delivery is None
    assert conn.violations
    assert "channel 5" in conn.violations[0]


def test_session_frames_on_a_channel_with_no_session_are_violations() -> None:
    conn = connected()
    feed_frames(
        conn,
        bframe(5, frames.flow()),
        bframe(0, Begin(remote_channel=9, next_outgoing_id=0, incoming_window=1, outgoing_window=1)),
    )
    assert len(conn.violations) == 2
    assert "flow on channel 5" in conn.violations[0]
    assert "our channel 9" in conn.violations[1]
    # a session the broker began may carry frames before we answer it
    feed_frames(conn, bframe(4, Begin(next_outgoing_id=0, incoming_window=9, outgoing_window=9)))
    feed_frames(conn, bframe(4, broker_attach("early", 0, SENDER)))
    assert len(conn.violations) == 2


def test_a_session_the_broker_begins_is_ours_once_we_answer() -> None:
    """§2.5.2: a begin with no remote-channel starts a session; our begin naming its channel answers it."""
    conn = connected()
    feed_frames(conn, bframe(4, Begin(next_outgoing_id=9, incoming_window=10, outgoing_window=10)))
    conn.send(frames.begin(remote_channel=4), 1)
    assert conn.remote_channels == {0: 0, 1: 4}
    session = conn.session(1)
    assert session.next_incoming_id == 9
    assert session.remote_incoming_window == 10


def test_incoming_window_and_transfer_ids_across_the_wrap() -> None:
    """§2.5.6: next-incoming-id counts transfer frames modulo 2^32; each one takes a slot of our window."""
    conn = connected(window=5, broker_next_outgoing_id=U32 - 2)
    session = conn.session(0)
    assert session.next_incoming_id == U32 - 2
    link = receiver(conn, credit=10)
    feed_frames(conn, *(btransfer(0, i) for i in range(4)))
    assert session.next_incoming_id == 2
    assert session.incoming_window == 1
    assert link.delivery_count == 4
    assert link.credit == 6
    flow = conn.flow()
    assert (flow.next_incoming_id, flow.incoming_window) == (2, 5)
    conn.send(flow)
    assert session.incoming_window == 5
    feed_frames(conn, *(btransfer(0, i) for i in range(4, 10)))
    assert conn.violations
    assert "beyond our incoming window" in conn.violations[0]


def test_remote_incoming_window_follows_the_brokers_flow_across_the_wrap() -> None:
    conn = connected(next_outgoing_id=U32 - 1, broker_window=3)
    session = conn.session(0)
    link = sender(conn, credit=10)
    assert session.remote_incoming_window == 3
    for i in range(3):
        conn.send(frames.transfer(0, i), 0, b"m")
    assert session.next_outgoing_id == 2
    assert session.remote_incoming_window == 0
    assert link.credit == 7
    assert link.delivery_count == 3
    feed_frames(conn, bframe(0, frames.flow(next_incoming_id=1, incoming_window=4)))
    assert session.remote_incoming_window == 3  # ids 1..4 allowed, 2..4 left


def test_a_flow_overtaken_by_our_transfers_leaves_a_negative_window_not_a_huge_one() -> None:
    """§2.5.6 remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id: serial
    arithmetic, so a flow the broker sent before our last transfers arrived gives a small negative number."""
    conn = connected()
    session = conn.session(0)
    sender(conn, credit=10)
    for i in range(3):
        conn.send(frames.transfer(0, i), 0, b"m")
    feed_frames(conn, bframe(0, frames.flow(next_incoming_id=0, incoming_window=1)))
    assert session.remote_incoming_window == -2


def test_a_flow_without_next_incoming_id_counts_from_our_initial_outgoing_id() -> None:
    """§2.5.6: "If the next-incoming-id field of the flow frame is not set, then remote-incoming-window is
    computed as follows: initial-outgoing-id(endpoint) + incoming-window(flow) - next-outgoing-id(endpoint)"."""
    conn = connected(next_outgoing_id=10)
    session = conn.session(0)
    sender(conn, credit=10)
    for i in range(3):
        conn.send(frames.transfer(0, i), 0, b"m")
    feed_frames(conn, bframe(0, frames.flow(next_incoming_id=None, incoming_window=50)))
    assert session.remote_incoming_window == 10 + 50 - 13


def test_remote_outgoing_window_shrinks_with_each_transfer_received() -> None:
    """§2.5.6: on receiving a transfer the endpoint decrements remote-outgoing-window."""
    conn = connected()
    session = conn.session(0)
    receiver(conn, credit=5)
    feed_frames(conn, bframe(0, frames.flow(next_incoming_id=0, incoming_window=100, outgoing_window=10)))
    feed_frames(conn, btransfer(0, 0), btransfer(0, 1))
    assert session.remote_outgoing_window == 8


def test_a_session_ended_both_ways_lets_its_channels_go() -> None:
    conn = connected(remote_channel=2)
    receiver(conn, remote_channel=2, credit=1)
    conn.send(End())
    feed_frames(conn, bframe(2, End()))
    assert conn.remote_channels == {}
    (frame,) = feed_frames(conn, btransfer(0, 0, channel=2))
    assert frame.link is None
    assert frame.delivery is None
    assert conn.violations
    assert "channel 2" in conn.violations[0]


# -- links (§2.6) -------------------------------------------------------------------------------------------
def test_an_attach_answer_binds_the_link_of_the_opposite_role() -> None:
    """§2.6.1: a link is named per direction, so a sender and a receiver may share a name; the broker's attach
    (its role the opposite of ours) answers the link of ours with the other role."""
    conn = connected()
    conn.send(frames.attach_sender("q", 0, "dup"))
    conn.send(frames.attach_receiver("q", 1, "dup"))
    (frame,) = feed_frames(conn, bframe(0, broker_attach("dup", 5, SENDER)))
    assert frame.link is not None
    assert frame.link.handle == 1
    (frame,) = feed_frames(conn, bframe(0, broker_attach("dup", 6, RECEIVER)))
    assert frame.link is not None
    assert frame.link.handle == 0
    links = conn.session(0).links
    assert (links[0].remote_handle, links[1].remote_handle) == (6, 5)


def test_a_link_the_broker_attaches_first_is_bound_when_we_answer() -> None:
    conn = connected()
    (frame,) = feed_frames(conn, bframe(0, broker_attach("pushed", 9, SENDER, initial=41)))
    assert frame.link is None
    conn.send(frames.attach_receiver("q", 0, "pushed"))
    link = conn.session(0).links[0]
    assert link.remote_handle == 9
    assert link.remote_attach is not None
    assert link.delivery_count == 41
    conn.send(conn.flow(0, 2))
    (frame,) = feed_frames(conn, btransfer(9, 0, b"hi"))
    assert frame.link is link
    assert frame.delivery is not None
    assert frame.delivery.link == "pushed"
    assert link.delivery_count == 42
    assert link.credit == 1
    assert conn.violations == []


def test_a_handle_reused_after_our_detach_survives_the_late_detach_answer() -> None:
    """§2.6.5: our handle is free once we sent detach; the broker's answering detach (for its own handle of the
    old link) must not take the new link that reuses our handle."""
    conn = connected()
    receiver(conn, handle=0, remote_handle=0, name="old")
    conn.send(Detach(handle=0, closed=True))
    conn.send(frames.attach_receiver("q", 0, "new"))
    (frame,) = feed_frames(conn, bframe(0, Detach(handle=0, closed=True)))
    assert frame.link is not None
    assert frame.link.name == "old"
    session = conn.session(0)
    assert session.links[0].name == "new"
    (frame,) = feed_frames(conn, bframe(0, broker_attach("new", 0, SENDER)))
    assert frame.link is session.links[0]
    assert session.by_remote[0].name == "new"


def test_a_link_detached_both_ways_frees_both_handles() -> None:
    conn = connected()
    receiver(conn, handle=2, remote_handle=7)
    session = conn.session(0)
    feed_frames(conn, bframe(0, Detach(handle=7, closed=True)))
    assert 2 in session.links  # until we detach too
    conn.send(Detach(handle=2, closed=True))
    assert session.links == {}
    assert session.by_remote == {}
    assert session.next_handle() == 0


def test_a_transfer_on_a_link_where_we_send_is_a_violation_and_counts_nothing() -> None:
    """§2.6.12: only the sender of a link transfers on it; the broker is the receiver of our sender link."""
    conn = connected()
    link = sender(conn, remote_handle=4, credit=3)
    (frame,) = feed_frames(conn, btransfer(4, 0))
    assert frame.delivery is None
    assert (link.delivery_count, link.credit) == (0, 3)
    assert conn.session(0).unsettled == {}
    assert conn.violations
    assert "we send" in conn.violations[0]


def test_a_transfer_after_the_brokers_detach_is_a_violation() -> None:
    conn = connected()
    link = receiver(conn, remote_handle=3, credit=3)
    feed_frames(conn, bframe(0, Detach(handle=3, closed=True)))
    (frame,) = feed_frames(conn, btransfer(3, 0))
    assert frame.delivery is None
    assert link.delivery_count == 0
    assert conn.violations
    assert "detached" in conn.violations[0]


# -- link flow control (§2.6.7) -----------------------------------------------------------------------------
def test_credit_of_our_sender_from_the_brokers_flow() -> None:
    """link-credit(snd) := delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)."""
    conn = connected()
    link = sender(conn, credit=3)
    assert link.credit == 3
    conn.send(frames.transfer(0, 0), 0, b"m")
    conn.send(frames.transfer(0, 1), 0, b"m")
    assert (link.delivery_count, link.credit) == (2, 1)
    # the broker's flow, sent after it saw our first transfer only: 1 + 5 - 2
    feed_frames(conn, bframe(0, frames.flow(handle=0, delivery_count=1, link_credit=5)))
    assert link.credit == 4


def test_a_stale_flow_gives_our_sender_no_credit_not_four_billion() -> None:
    conn = connected()
    link = sender(conn, credit=2)
    conn.send(frames.transfer(0, 0), 0, b"m")
    conn.send(frames.transfer(0, 1), 0, b"m")
    feed_frames(conn, bframe(0, frames.flow(handle=0, delivery_count=0, link_credit=1)))
    assert link.credit == -1  # serial arithmetic: 0 + 1 - 2


def test_credit_across_the_delivery_count_wrap() -> None:
    conn = connected()
    link = receiver(conn, initial=U32 - 1)
    conn.send(conn.flow(0, 3))
    assert conn.flow(0).delivery_count == U32 - 1
    feed_frames(conn, btransfer(0, 0), btransfer(0, 1))
    assert (link.delivery_count, link.credit) == (1, 1)


def test_our_flow_with_an_older_delivery_count_grants_from_that_count() -> None:
    """The sender computes our grant from the delivery-count our flow carries, so the credit we keep must too."""
    conn = connected()
    link = receiver(conn, credit=5)
    feed_frames(conn, btransfer(0, 0), btransfer(0, 1), btransfer(0, 2))
    assert (link.delivery_count, link.credit) == (3, 2)
    conn.send(frames.flow(handle=0, delivery_count=1, link_credit=5))
    assert link.credit == 1 + 5 - 3


def test_a_drain_answered_by_the_broker_uses_up_our_credit() -> None:
    conn = connected()
    link = receiver(conn)
    conn.send(conn.flow(0, 4, drain=True))
    assert link.drain
    assert link.credit == 4
    feed_frames(conn, btransfer(0, 0))
    # the broker has no more: it advances its delivery-count by the credit left (§2.6.7 drain)
    (frame,) = feed_frames(conn, bframe(0, frames.flow(handle=0, delivery_count=4, link_credit=0, drain=True)))
    assert frame.link is link
    assert (link.delivery_count, link.credit) == (4, 0)


def test_our_sender_answering_a_drain_uses_up_its_credit() -> None:
    """§2.6.7: a sender that drains advances its delivery-count by its credit and says so in a flow."""
    conn = connected()
    link = sender(conn, credit=5)
    conn.send(frames.transfer(0, 0), 0, b"m")
    conn.send(frames.flow(handle=0, delivery_count=5, link_credit=0, drain=True))
    assert (link.delivery_count, link.credit) == (5, 0)


def test_available_is_what_the_broker_last_said() -> None:
    conn = connected()
    link = receiver(conn, credit=1)
    feed_frames(conn, bframe(0, frames.flow(handle=0, delivery_count=0, link_credit=1, available=12)))
    assert link.available == 12


def test_flow_leaves_delivery_count_unset_until_the_sender_attached() -> None:
    """§2.7.4 flow, delivery-count: "In the event that the receiving link endpoint has not yet seen the initial
    attach frame from the sender this field MUST NOT be set." """
    conn = connected()
    conn.send(frames.attach_receiver("q", 0, "early"))
    assert conn.flow(0, 5).delivery_count is None
    feed_frames(conn, bframe(0, broker_attach("early", 0, SENDER, initial=7)))
    assert conn.flow(0, 5).delivery_count == 7


def test_an_aborted_first_frame_still_counts_a_delivery_both_ways() -> None:
    """A transfer that starts a delivery takes a credit and a delivery-count step even when it aborts it."""
    conn = connected()
    out = sender(conn, credit=5)
    conn.send(frames.transfer(0, 0, aborted=True), 0)
    assert (out.delivery_count, out.credit) == (1, 4)
    into = receiver(conn, handle=1, remote_handle=1, name="r", credit=5)
    delivery = delivery_of(feed(conn, btransfer(1, 0, aborted=True)))
    assert delivery.aborted
    assert delivery.complete
    assert (into.delivery_count, into.credit) == (1, 4)


# -- deliveries (§2.6.12-14) --------------------------------------------------------------------------------
def test_a_multi_frame_delivery_is_assembled_on_its_last_frame() -> None:
    conn = connected()
    receiver(conn, credit=2)
    first = delivery_of(feed(conn, btransfer(0, 0, b"ab", more=True)))
    assert (first.complete, first.payload, first.frames) == (False, b"", 1)
    middle = delivery_of(feed(conn, btransfer(0, None, b"cd", more=True, settled=True)))
    assert middle.settled
    assert not middle.complete
    last = delivery_of(feed(conn, btransfer(0, None, b"ef", state=Accepted())))
    assert (last.complete, last.payload, last.frames, last.delivery_id, last.tag) == (True, b"abcdef", 3, 0, b"0")
    assert last.settled  # settled on any frame settles the delivery
    assert last.state == Accepted()
    session = conn.session(0)
    assert session.unsettled == {}
    assert session.next_incoming_id == 3
    assert conn.session(0).links[0].credit == 1  # one delivery, three frames


def test_an_aborted_delivery_is_complete_and_needs_no_settling() -> None:
    conn = connected()
    receiver(conn, credit=2)
    feed(conn, btransfer(0, 0, b"ab", more=True))
    aborted = delivery_of(feed(conn, btransfer(0, None, b"", aborted=True)))
    assert aborted.aborted
    assert aborted.complete
    assert aborted.payload == b"ab"
    assert conn.session(0).unsettled == {}
    assert delivery_of(feed(conn, btransfer(0, 1, b"next"))).delivery_id == 1
    assert conn.violations == []


def test_a_continuation_with_no_delivery_in_progress_is_a_violation() -> None:
    conn = connected()
    receiver(conn, credit=2)
    (frame,) = feed_frames(conn, btransfer(0, None, b"ab"))
    assert frame.delivery is None
    assert conn.violations


def test_dispositions_settle_ranges_including_across_the_wrap() -> None:
    conn = connected(broker_next_outgoing_id=U32 - 2)
    receiver(conn, credit=10)
    ids = [U32 - 2, U32 - 1, 0, 1, 2]
    feed_frames(conn, *(btransfer(0, i) for i in ids))
    session = conn.session(0)
    assert sorted(session.unsettled) == sorted(ids)
    conn.send(frames.disposition(U32 - 2, 0, state=Accepted()))
    assert sorted(session.unsettled) == [1, 2]
    feed_frames(conn, bframe(0, frames.disposition(1, 2, role=SENDER)))
    assert session.unsettled == {}


def test_a_disposition_over_every_id_returns_at_once() -> None:
    """A range of 2^32 ids must not be walked id by id (the broker's bytes could hang the test otherwise)."""
    conn = connected()
    receiver(conn, credit=3)
    feed_frames(conn, btransfer(0, 0), btransfer(0, 7))
    feed_frames(conn, bframe(0, frames.disposition(1, U32 - 1, role=SENDER)))
    assert list(conn.session(0).unsettled) == [0]
    conn.send(frames.disposition(0, U32 - 1))
    assert conn.session(0).unsettled == {}


def test_the_broker_settling_a_delivery_still_arriving_is_a_violation() -> None:
    conn = connected()
    receiver(conn, credit=3)
    feed(conn, btransfer(0, 4, b"a", more=True))
    feed_frames(conn, bframe(0, frames.disposition(3, 5, role=SENDER)))
    assert conn.violations
    assert "before sending all of it" in conn.violations[0]


def test_our_sent_delivery_ids_are_consecutive_per_session() -> None:
    conn = connected()
    sender(conn, credit=5)
    sender(conn, handle=1, remote_handle=1, name="s2", credit=5)
    conn.send(frames.transfer(0, 0, more=True), 0, b"a")
    assert conn.next_delivery_id() == 1
    conn.send(frames.transfer(1, 1), 0, b"b")
    conn.send(frames.transfer(0, None), 0, b"c")
    assert conn.next_delivery_id() == 2
    assert conn.session(0).links[0].delivery_count == 1


# -- property tests -----------------------------------------------------------------------------------------
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def drive(conn: ClientConnection, data: bytes, cuts: list[int]) -> tuple[list[Event], bool]:
    """Feed ``data`` cut at ``cuts``, then end the stream; the events, and whether a ``ProtocolError`` came."""
    events: list[Event] = []
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for start, end in itertools.pairwise(points):
            conn.receive_data(data[start:end])
            while (event := conn.next_event()) is not None:
                events.append(event)
        conn.receive_data(b"")
        events.append(conn.next_event())
    except ProtocolError:
        return events, True
    return events, False


@FUZZ
@given(data=st.binary(max_size=200), header_first=st.booleans(), cuts=st.lists(st.integers(0, 300), max_size=4))
def test_any_bytes_give_events_or_protocol_error(data: bytes, header_first: bool, cuts: list[int]) -> None:
    conn = ClientConnection()
    if not header_first:
        conn = connected()
        receiver(conn, credit=3)
    drive(conn, data, cuts)  # raises nothing else


u32 = st.integers(0, U32 - 1)
small = st.integers(0, 3) | st.sampled_from([U32 - 1, U32 - 2])
maybe = st.none() | small
flag = st.none() | st.booleans()

performatives = st.one_of(
    st.builds(
        Transfer,
        handle=maybe,
        delivery_id=maybe,
        delivery_tag=st.none() | st.binary(max_size=3),
        more=flag,
        settled=flag,
        aborted=flag,
        state=st.none() | st.just(Accepted()),
    ),
    st.builds(
        Flow,
        next_incoming_id=st.none() | u32,
        incoming_window=u32,
        next_outgoing_id=u32,
        outgoing_window=u32,
        handle=maybe,
        delivery_count=st.none() | u32,
        link_credit=st.none() | u32,
        available=maybe,
        drain=flag,
        echo=flag,
    ),
    st.builds(Disposition, role=st.booleans(), first=u32, last=st.none() | u32, settled=flag),
    st.builds(
        Attach,
        name=st.sampled_from(["r", "s", "x"]),
        handle=small,
        role=st.booleans(),
        initial_delivery_count=st.none() | u32,
    ),
    st.builds(Detach, handle=small, closed=flag),
    st.builds(
        Begin,
        remote_channel=st.none() | st.integers(0, 3) | st.just(0xFFFF),
        next_outgoing_id=u32,
        incoming_window=u32,
        outgoing_window=u32,
    ),
    st.just(End()),
    st.just(Close()),
    st.just(Open(container_id="b")),
)
channels = st.integers(0, 2)
frame_specs = st.tuples(channels, performatives, st.binary(max_size=6), st.sampled_from([0, 0, 0, 1]))


def encode_spec(spec: tuple[int, Any, bytes, int], extended: bool = False) -> bytes:
    channel, performative, payload, frame_type = spec
    whole = encode_frame(channel, performative, payload, frame_type)
    if not extended:
        return whole
    return frames.raw_frame(doff=3, type=frame_type, channel=channel, body=b"\x00" * 4 + whole[8:])


@FUZZ
@given(
    ops=st.lists(st.tuples(st.booleans(), frame_specs), max_size=12),
    flip=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
    cuts=st.lists(st.integers(0, 10_000), max_size=5),
)
def test_any_frames_either_way_give_events_or_protocol_error(
    ops: list[tuple[bool, tuple[int, Any, bytes, int]]], flip: tuple[int, int] | None, cuts: list[int]
) -> None:
    """Performatives with any field values, sent by us (the bookkeeping follows, never refuses) or received
    (after one byte possibly changed): nothing but ``ProtocolError`` comes out of the connection."""
    conn = connected()
    receiver(conn, credit=3)
    sender(conn, handle=1, remote_handle=1, credit=3)
    received = bytearray()
    for ours, spec in ops:
        channel, performative, payload, frame_type = spec
        if ours:
            conn.send(performative, channel, payload, frame_type)
        else:
            received += encode_spec(spec)
    if flip is not None and received:
        received[flip[0] % len(received)] = flip[1]
    drive(conn, bytes(received), cuts)


@FUZZ
@given(
    specs=st.lists(st.tuples(frame_specs, st.booleans(), st.booleans()), max_size=10),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_valid_frames_split_anywhere_parse_as_unsplit(
    specs: list[tuple[tuple[int, Any, bytes, int], bool, bool]], cuts: list[int]
) -> None:
    stream = b"".join(
        frames.heartbeat(spec[0]) if heartbeat else encode_spec(spec, extended) for spec, extended, heartbeat in specs
    )
    whole = drive(connected(), stream, [])
    split = drive(connected(), stream, cuts)
    assert split == whole


# -- model: the client's counts equal the broker engine's, both link directions (§2.5.6, §2.6.7) ------------
class CreditAgainstTheEngine(RuleBasedStateMachine):
    """The client core talks to the broker's own engine in memory: after every step and the frames it causes,
    what the client counted (delivery-count, link-credit, transfer ids, windows) equals what the engine, the
    other end of each link and of the session, counted. Deliveries of 1 to 4 frames (max-frame-size 512)."""

    def __init__(self) -> None:
        super().__init__()
        self.server = ServerConnection()
        self.client = ClientConnection()
        self.engine_links: dict[str, Any] = {}
        client = self.client
        client.send_header(AMQP_HEADER)
        client.send(frames.open_(max_frame_size=UInt(512)))
        client.send(frames.begin(incoming_window=8))
        client.send(frames.attach_receiver("q", 0, "in"))  # the engine sends on it
        client.send(frames.attach_sender("q", 1, "out"))  # the engine receives on it
        self.pump()
        assert set(self.engine_links) == {"in", "out"}

    def pump(self) -> None:
        """Move bytes both ways until neither side has anything to say."""
        for _ in range(1000):
            data = self.client.data_to_send()
            if data:
                for event in self.server.receive_data(data, 0.0):
                    if isinstance(event, LinkAttached):
                        link = event.link
                        self.server.accept_attach(link, source=link.source, target=link.target)
                        self.engine_links[link.name] = link
            out = self.server.data_to_send()
            if out:
                self.client.receive_data(out)
                while (event := self.client.next_event()) is not None:
                    assert not isinstance(event, Ended)
            if not data and not out:
                return
        raise AssertionError("the two ends never went quiet")

    @property
    def links(self) -> dict[int, Link]:
        return self.client.session(0).links

    @rule(credit=st.integers(0, 6), drain=st.booleans())
    def client_grants(self, credit: int, drain: bool) -> None:
        self.client.send(self.client.flow(0, credit, drain=drain or None))
        self.pump()

    @precondition(lambda self: not self.server.sessions[0].pending)
    @rule(credit=st.integers(0, 6))
    def client_grants_without_a_delivery_count(self, credit: int) -> None:
        """The broker reads a null delivery-count as "``credit`` from your count now", which we can only
        follow while no delivery is on its way (§2.7.4 means it for a receiver that has not seen the attach)."""
        self.client.send(self.client.flow(0, credit, delivery_count=None))
        self.pump()

    @rule()
    def client_opens_its_window(self) -> None:
        self.client.send(self.client.flow())
        self.pump()

    @rule(frames_long=st.integers(1, 4), settled=st.booleans())
    def engine_delivers(self, frames_long: int, settled: bool) -> None:
        link = self.engine_links["in"]
        if self.server.can_send(link):
            self.server.deliver(link, b"x" * (400 * frames_long - 300), settled=settled)
            self.pump()

    @rule(credit=st.integers(0, 6), frames_long=st.integers(1, 2))
    def a_grant_crosses_a_delivery(self, credit: int, frames_long: int) -> None:
        """Our flow is on the wire while the engine sends: it grants from a delivery-count that is behind."""
        self.client.send(self.client.flow(0, credit))
        link = self.engine_links["in"]
        if self.server.can_send(link):
            self.server.deliver(link, b"x" * (400 * frames_long - 300), settled=True)
        self.pump()

    @rule()
    def engine_completes_a_drain(self) -> None:
        self.server.complete_drain(self.engine_links["in"])
        self.pump()

    @rule(credit=st.integers(0, 6))
    def engine_grants(self, credit: int) -> None:
        self.server.grant_credit(self.engine_links["out"], credit)
        self.pump()

    @rule(frames_long=st.integers(1, 3))
    def client_sends(self, frames_long: int) -> None:
        session = self.client.session(0)
        if self.links[1].credit <= 0 or session.remote_incoming_window < frames_long:
            return
        delivery_id = self.client.next_delivery_id()
        for part in range(frames_long):
            more = part < frames_long - 1
            first = part == 0
            self.client.send(
                frames.transfer(1, delivery_id if first else None, settled=True, more=more or None), 0, b"y" * 100
            )
        self.pump()

    @invariant()
    def both_ends_agree(self) -> None:
        session = self.client.session(0)
        engine_session = self.server.sessions[0]
        assert self.client.violations == []
        # the engine counts a delivery when it takes it; we count it when its first frame comes, which waits
        # while our session window is closed (§2.5.6)
        held = len({id(delivery) for delivery, _ in engine_session.pending if not delivery.begun})
        for name, handle, unseen in (("in", 0, held), ("out", 1, 0)):
            ours, theirs = self.links[handle], self.engine_links[name]
            assert ours.delivery_count == (theirs.delivery_count - unseen) % U32, name
            # a grant overtaken by more deliveries than it gave leaves the sender none: the engine says 0, we
            # say how far below zero (§2.6.7 link-credit(snd) = delivery-count(rcv) + link-credit(rcv) - ...)
            assert max(ours.credit, 0) == theirs.credit + unseen, name
        assert session.next_incoming_id == engine_session.next_outgoing_id
        assert session.next_outgoing_id == engine_session.next_incoming_id
        assert session.incoming_window == engine_session.remote_incoming_window
        assert session.remote_incoming_window == engine_session.incoming_window


CreditAgainstTheEngine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_credit_against_the_engine = CreditAgainstTheEngine.TestCase


# -- probes against the real broker over TCP ------------------------------------------------------------------
@pytest.fixture
def real_broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as running:
        yield running


def post(peer: ScriptedPeer, address: str, bodies: list[bytes]) -> None:
    """Send ``bodies`` to ``address`` on a new sender link (handle 9), each accepted."""
    peer.attach_sender(address, handle=9, name=f"post-{address}")
    link = peer.conn.session(0).links[9]
    granted = peer.expect(Flow)
    assert link.credit == granted.link_credit  # the credit our sender holds is the broker's grant
    for body in bodies:
        delivery_id = peer.conn.next_delivery_id()
        before = link.credit
        peer.transfer(9, delivery_id, body)
        assert link.credit == before - 1
        while True:
            frame = peer.receive()
            if isinstance(frame.performative, Disposition):
                break
            assert isinstance(frame.performative, Flow), frame  # a top-up, counted as it comes
        assert isinstance(frame.performative.state, Accepted)
    assert link.delivery_count == len(bodies)


def test_probe_a_multi_frame_delivery_from_the_broker_is_assembled(real_broker: ThreadedBroker) -> None:
    body = frames.message("z" * 5000)
    with ScriptedPeer.connect("127.0.0.1", real_broker.port) as peer:
        peer.open(max_frame_size=UInt(512))
        peer.begin()
        post(peer, "big", [body])
        peer.attach_receiver("big", handle=0, name="take")
        peer.flow(handle=0, link_credit=1)
        parts = 0
        while True:
            frame = peer.expect_frame(Transfer)
            parts += 1
            assert frame.delivery is not None
            assert frame.delivery.frames == parts
            if frame.delivery.complete:
                break
            assert frame.delivery.payload == b""
        delivery = frame.delivery
        assert parts > 5
        assert delivery.payload == body
        assert not delivery.settled
        session = peer.conn.session(0)
        link = session.links[0]
        assert (link.delivery_count, link.credit) == (1, 0)
        assert list(session.unsettled) == [delivery.delivery_id]
        peer.disposition(delivery.delivery_id, state=Accepted())
        assert session.unsettled == {}
        assert peer.conn.violations == []


def test_probe_session_window_accounting_after_many_transfers(real_broker: ThreadedBroker) -> None:
    count = 40
    with ScriptedPeer.connect("127.0.0.1", real_broker.port) as peer:
        peer.open()
        peer.begin(incoming_window=10)
        post(peer, "many", [frames.message(f"m{i}") for i in range(count)])
        session = peer.conn.session(0)
        assert session.next_outgoing_id == count
        peer.attach_receiver("many", handle=0, name="take")
        peer.flow(handle=0, link_credit=count)
        received = []
        while len(received) < count:
            if session.incoming_window == 0:  # the broker must stop here until we open the window again
                assert len(received) % 10 == 0
                peer.flow()
            frame = peer.expect_frame(Transfer)
            assert frame.delivery is not None
            received.append(frame.delivery.delivery_id)
        assert received == list(range(count))
        assert session.next_incoming_id == count
        link = session.links[0]
        assert (link.delivery_count, link.credit) == (count, 0)
        peer.disposition(0, count - 1, state=Accepted())
        assert session.unsettled == {}
        assert peer.conn.violations == []


def test_probe_a_drain_on_an_empty_queue_uses_up_our_credit(real_broker: ThreadedBroker) -> None:
    with ScriptedPeer.connect("127.0.0.1", real_broker.port) as peer:
        peer.open()
        peer.begin()
        peer.attach_receiver("empty", handle=0, name="take")
        peer.flow(handle=0, link_credit=7, drain=True)
        answer = peer.expect(Flow)
        link = peer.conn.session(0).links[0]
        assert answer.delivery_count == 7
        assert (link.delivery_count, link.credit) == (7, 0)
