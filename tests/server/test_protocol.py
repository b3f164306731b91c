"""The real broker over TCP, driven frame by frame by ``ScriptedPeer``.

These pin what a peer sees on the wire at the edges of the protocol: header exchange, SASL, and how a
broken connection is closed without harming its neighbours. Every socket wait is bounded by the peer's
timeout (5 s), far inside the global pytest timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Header,
    MessageAnnotations,
    Open,
    Rejected,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import AMQP_HEADER, SASL_HEADER, TLS_HEADER
from minibroker.amqp.types import Described, Symbol, UInt, ULong
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

HOST = "127.0.0.1"


def condition(performative: Any) -> str | None:
    return None if performative.error is None else str(performative.error.condition)


@pytest.fixture
def peer(broker: ThreadedBroker) -> Iterator[ScriptedPeer]:
    with ScriptedPeer.connect(HOST, broker.port) as p:
        yield p


@pytest.fixture
def secured() -> Iterator[ThreadedBroker]:
    """A broker with users configured: PLAIN is checked, ANONYMOUS refused, SASL required."""
    with run_in_thread({"server": {"port": 0}, "auth": {"users": {"alice": "secret"}}}) as running:
        yield running


def send_and_receive(peer: ScriptedPeer, address: str, body: str) -> bytes:
    """On an open connection: begin, post ``body`` to ``address``, consume it back; its payload."""
    peer.begin()
    peer.attach_sender(address, handle=0)
    assert peer.expect(Flow).link_credit
    payload = frames.message(body)
    peer.transfer(0, 0, payload)
    disposition = peer.expect(Disposition)
    assert isinstance(disposition.state, Accepted)
    assert disposition.settled
    peer.attach_receiver(address, handle=1)
    peer.flow(handle=1, link_credit=1)
    item = peer.expect_frame(Transfer)
    peer.disposition(item.performative.delivery_id, state=Accepted())
    return item.payload


# -- header exchange -----------------------------------------------------------------------------------
def test_header_exchange_open_and_clean_close(peer: ScriptedPeer) -> None:
    peer.send_header(AMQP_HEADER)
    assert peer.expect_header() == AMQP_HEADER
    peer.send(frames.open_(container_id="scripted"))
    remote = peer.expect(Open, channel=0)
    assert remote.container_id == "minibroker"
    assert remote.max_frame_size == 65536
    reply = peer.close()
    assert reply.error is None


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(TLS_HEADER, id="tls"),
        pytest.param(b"AMQP\x00\x01\x00\x01", id="unsupported-revision"),
        pytest.param(b"HTTP/1.1", id="http"),
    ],
)
def test_unsupported_protocol_header(peer: ScriptedPeer, header: bytes) -> None:
    peer.send_header(header)
    assert peer.expect_header() == AMQP_HEADER  # §2.2: the header we do support
    peer.expect_closed()


def test_open_works_on_a_message_round_trip(peer: ScriptedPeer) -> None:
    peer.open()
    assert send_and_receive(peer, "round-trip", "hello") == frames.message("hello")


# -- SASL -------------------------------------------------------------------------------------------------
def test_sasl_mechanisms_offered_by_default(peer: ScriptedPeer) -> None:
    peer.send_header(SASL_HEADER)
    assert peer.expect_header() == SASL_HEADER
    mechanisms = peer.expect_sasl(SaslMechanisms)
    assert set(mechanisms.sasl_server_mechanisms or []) == {"ANONYMOUS", "PLAIN"}


@pytest.mark.parametrize("sasl", ["ANONYMOUS", ("PLAIN", "anyone", "anything")])
def test_sasl_then_open(peer: ScriptedPeer, sasl: Any) -> None:
    remote = peer.open(sasl=sasl)
    assert remote.container_id == "minibroker"
    assert send_and_receive(peer, "after-sasl", "authenticated") == frames.message("authenticated")


def test_sasl_plain_with_configured_user(secured: ThreadedBroker) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as peer:
        peer.open(sasl=("PLAIN", "alice", "secret"))
        peer.close()


@pytest.mark.parametrize(
    "sasl",
    [
        pytest.param(("PLAIN", "alice", "wrong"), id="bad-password"),
        pytest.param(("PLAIN", "mallory", "secret"), id="unknown-user"),
        pytest.param("ANONYMOUS", id="anonymous-refused"),
    ],
)
def test_sasl_auth_failure_closes_the_connection(secured: ThreadedBroker, sasl: Any) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as peer:
        outcome = peer.authenticate(sasl)
        assert outcome == SaslOutcome(code=1)  # §5.3.3.6 auth
        peer.expect_closed()


def test_secured_broker_refuses_a_peer_that_skips_sasl(secured: ThreadedBroker) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as peer:
        peer.send_header(AMQP_HEADER)
        assert peer.expect_header() == SASL_HEADER  # the layer we require
        peer.expect_closed()


# -- broken peers do not harm their neighbours ------------------------------------------------------------
@pytest.mark.parametrize(
    ("garbage", "expected", "needs_our_close"),
    [
        pytest.param(frames.undecodable_frame(), Condition.DECODE_ERROR, True, id="undecodable-body"),
        pytest.param(b"\x00\x00\x00\x03garbage!", Condition.FRAMING_ERROR, False, id="bad-frame-header"),
        pytest.param(frames.frame(6, frames.flow()), Condition.NOT_ALLOWED, True, id="no-such-session"),
    ],
)
def test_garbage_closes_only_that_connection(
    broker: ThreadedBroker, garbage: bytes, expected: Condition, needs_our_close: bool
) -> None:
    with ScriptedPeer.connect(HOST, broker.port) as bystander, ScriptedPeer.connect(HOST, broker.port) as bad:
        bystander.open()
        bad.open()
        bad.send_raw(garbage)
        close = bad.expect(Close)
        assert condition(close) == expected
        if needs_our_close:
            bad.send(Close())  # the broker waits for our close while the stream can still be read
        bad.expect_closed()
        # the connection opened before the bad one carries on
        assert send_and_receive(bystander, "bystander", "still here") == frames.message("still here")
        bystander.close()


def test_frame_larger_than_max_frame_size(peer: ScriptedPeer) -> None:
    remote = peer.open()
    assert remote.max_frame_size == 65536
    peer.begin()
    peer.attach_sender("big", handle=0)
    peer.expect(Flow)
    # a well-formed transfer, just bigger than the broker said it accepts (§2.7.1, §2.8.16)
    peer.transfer(0, 0, frames.message("x" * 70_000))
    close = peer.expect(Close)
    assert condition(close) == Condition.FRAMING_ERROR
    peer.expect_closed()


def test_refused_attach_handshake_leaves_the_session_usable() -> None:
    config = {"server": {"port": 0}, "broker": {"auto_create": False}, "queues": {"known": {}}}
    with run_in_thread(config) as running, ScriptedPeer.connect(HOST, running.port) as peer:
        peer.open()
        peer.begin()
        refused = peer.attach_sender("unknown", handle=0)
        assert refused.target is None
        detach = peer.expect(Detach)
        assert condition(detach) == Condition.NOT_FOUND
        peer.send(Detach(handle=UInt(0), closed=True))  # §2.6.2: our answer ends the handshake
        # the same session and even the same handle work afterwards
        accepted = peer.attach_sender("known", handle=0)
        assert isinstance(accepted, Attach)
        assert accepted.target is not None
        assert peer.expect(Flow).link_credit
        peer.close()


def test_producer_credit_is_replenished_with_a_credit_of_one() -> None:
    with run_in_thread({"server": {"port": 0}, "broker": {"link_credit": 1}}) as running:
        with ScriptedPeer.connect(HOST, running.port) as peer:
            peer.open()
            peer.begin()
            peer.attach_sender("trickle", handle=0)
            assert peer.expect(Flow).link_credit == 1
            for delivery_id in range(3):
                peer.transfer(0, delivery_id, frames.message(delivery_id))
                assert isinstance(peer.expect(Disposition).state, Accepted)
                flow = peer.expect(Flow)
                assert (flow.handle, flow.link_credit) == (0, 1)
            peer.close()
        assert running.queue("trickle").depth == 3


def test_peer_wait_fails_with_a_clear_message(broker: ThreadedBroker) -> None:
    with ScriptedPeer.connect(HOST, broker.port, timeout=0.2) as peer:
        peer.open()
        with pytest.raises(AssertionError, match=r"timed out waiting for a frame; last frames received: .*Open"):
            peer.receive()  # the broker has nothing to say until we speak


# -- leniency: symbol-keyed maps sent with string keys -----------------------------------------------------------
def string_keyed_error(condition: str, description: str, info: dict[str, Any]) -> Described:
    """An ``error`` whose info map has string keys, as rhea, go-amqp and Azure's JavaScript SDK send it (built by
    hand: our encoder would make the keys symbols)."""
    return Described(ULong(Error.DESCRIPTOR_CODE), [Symbol(condition), description, info])


def test_rejected_with_a_string_keyed_info_is_a_rejection(broker: ThreadedBroker, peer: ScriptedPeer) -> None:
    peer.open()
    peer.begin()
    peer.attach_sender("lenient", handle=0)
    peer.expect(Flow)
    for delivery_id in (0, 1):
        peer.transfer(0, delivery_id, frames.message(f"m{delivery_id}"))
        assert isinstance(peer.expect(Disposition).state, Accepted)
    peer.attach_receiver("lenient", handle=1)
    peer.flow(handle=1, link_credit=2)
    first, second = peer.expect_frame(Transfer), peer.expect_frame(Transfer)
    info = {"DeadLetterReason": "poison", "DeadLetterErrorDescription": "bad order"}
    rejected = Described(ULong(Rejected.DESCRIPTOR_CODE), [string_keyed_error("amqp:internal-error", "no", info)])
    peer.disposition(first.performative.delivery_id, state=rejected)
    peer.disposition(second.performative.delivery_id, state=Accepted())
    # the connection is still there, and the rejected message went where rejected messages go
    peer.attach_sender("lenient-after", handle=2)
    peer.expect(Flow)
    broker.wait_for(lambda: broker.queue("lenient.DLQ").depth == 1)
    assert broker.queue("lenient").depth == 0
    (dead,) = broker.queue("lenient.DLQ").peek()
    assert dead.body == "m0"
    assert dead.annotations["x-opt-dead-letter-reason"] == "rejected"
    assert dead.annotations["x-opt-dead-letter-description"] == "no"
    # a detach, an end and a close whose error carries string keys are taken as they are
    info = {"reason": "bye"}
    error = string_keyed_error("amqp:internal-error", "gone", info)
    peer.send(Described(ULong(Detach.DESCRIPTOR_CODE), [UInt(2), True, error]))
    assert peer.expect(Detach).handle == 2
    peer.send(Described(ULong(End.DESCRIPTOR_CODE), [error]))
    assert peer.expect(End).error is None
    peer.begin(channel=1)
    peer.send(Described(ULong(Close.DESCRIPTOR_CODE), [error]))
    assert peer.expect(Close).error is None
    peer.expect_closed()


def _annotated(key: object, body: str) -> bytes:
    """A durable header, message-annotations ``{key: 1}`` with the key encoded as given, an amqp-value body."""
    annotations = codec.encode(Described(ULong(MessageAnnotations.DESCRIPTOR_CODE), {key: 1}))
    return codec.encode(Header(durable=True, ttl=UInt(60_000))) + annotations + codec.encode(AmqpValue(body))


def test_a_message_whose_annotations_do_not_decode_is_rejected_with_decode_error(
    broker: ThreadedBroker, peer: ScriptedPeer
) -> None:
    # §3.2.10: annotation keys are symbols or ulongs (string keys are taken as symbols); other keys, and a header
    # that does not decode, make a message the broker cannot keep its promises for (durable, ttl, priority)
    peer.open()
    peer.begin()
    peer.attach_sender("annotated", handle=0)
    peer.expect(Flow)
    for delivery_id, key in enumerate(["clé", 7, UInt(3)]):
        peer.transfer(0, delivery_id, _annotated(key, "bad"))
        rejected = peer.expect(Disposition).state
        assert isinstance(rejected, Rejected), rejected
        assert rejected.error is not None
        assert rejected.error.condition == Condition.DECODE_ERROR
    peer.transfer(0, 3, _annotated("clé", "bad, pre-settled"), settled=True)  # dropped: nobody to tell
    for delivery_id, key in enumerate([ULong(5), Symbol("x-opt-a"), "x-opt-b"], start=4):
        peer.transfer(0, delivery_id, _annotated(key, "good"))  # the keys annotations may have (§3.2.10)
        assert isinstance(peer.expect(Disposition).state, Accepted)
    peer.close()
    broker.wait_for(lambda: broker.queue("annotated").depth == 3)
    assert [m.body for m in broker.queue("annotated").peek()] == ["good"] * 3


def test_open_begin_attach_and_flow_properties_with_string_keys(broker: ThreadedBroker, peer: ScriptedPeer) -> None:
    peer.send_header(AMQP_HEADER)
    assert peer.expect_header() == AMQP_HEADER
    properties = {"product": "rhea", "version": "3"}
    peer.send_raw(raw_performative(0, frames.open_(), properties=properties))
    assert isinstance(peer.expect(Open), Open)
    peer.send_raw(raw_performative(0, frames.begin(), properties=properties))
    assert isinstance(peer.expect(Begin), Begin)
    peer.send_raw(raw_performative(0, frames.attach_receiver("props", 0), properties=properties))
    assert isinstance(peer.expect(Attach), Attach)
    peer.send_raw(raw_performative(0, frames.flow(handle=0, link_credit=1, next_incoming_id=0), properties=properties))
    peer.send(Detach(handle=UInt(0), closed=True))
    assert peer.expect(Detach).error is None  # the flow was taken: no decode-error closed the connection
    peer.close()


def raw_performative(channel: int, performative: Any, **string_keyed: dict[str, Any]) -> bytes:
    """The frame of ``performative`` with the given fields maps set with string keys (bypassing our encoder)."""
    values = performative.field_values()
    for name, value in string_keyed.items():
        values[[f.name for f in performative.FIELDS].index(name)] = value
    while values and values[-1] is None:
        values.pop()
    return frames.frame(channel, Described(ULong(performative.DESCRIPTOR_CODE), values))


def test_stopping_the_broker_closes_each_connection_with_connection_forced() -> None:
    """A broker that stops (SIGTERM, the end of ``serve``) tells each peer why its socket ends: a close with
    amqp:connection:forced, written before the socket goes (§2.4.3, §2.8.15); a peer that does not answer it holds
    the stop up a moment at most."""
    with run_in_thread({"server": {"port": 0}}) as running:
        peer = ScriptedPeer.connect(HOST, running.port)
        peer.open()
        peer.begin()
        started = time.monotonic()
    stopped_in = time.monotonic() - started
    with peer:
        close = peer.expect(Close)
        assert close.error is not None
        assert close.error.condition == Condition.CONNECTION_FORCED
        peer.expect_closed()
    assert stopped_in < 1.0


def test_a_connection_opened_while_the_broker_stops_is_refused_with_connection_forced() -> None:
    """A connect that races the stop gets its close too: while the stop waits for the closes to be written (here
    up to a second, held by a peer that reads nothing), a new peer's open is answered with an open and a close
    with amqp:connection:forced, never admitted and then cut without a word."""
    cm = run_in_thread({"server": {"port": 0}})
    running = cm.__enter__()
    with ScriptedPeer.connect(HOST, running.port) as sender, ScriptedPeer.connect(HOST, running.port) as idle:
        idle.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # no window grown to take it all
        sender.open()
        sender.begin()
        sender.attach_sender("q")
        credit = sender.expect(Flow).link_credit
        for delivery_id in range(min(credit, 200)):  # some 12 MB: more than the sockets' buffers hold
            sender.transfer(0, delivery_id, frames.message("x" * 60_000), settled=True)
        idle.open()
        idle.begin()
        idle.attach_receiver("q")
        idle.flow(0, 1000)  # and reads nothing more: the broker's writes to it block
        running.wait_for(lambda: running.queue("q").stats().acquired > 0)
        stopping = threading.Thread(target=cm.__exit__, args=(None, None, None))
        stopping.start()
        try:
            deadline = time.monotonic() + 5
            while not running.running._server.stopping:  # the stop has begun; it waits for the idle peer
                assert time.monotonic() < deadline, "the stop never began"
                time.sleep(0.005)
            with ScriptedPeer.connect(HOST, running.port) as late:
                late.open()
                close = late.expect(Close)
                assert close.error is not None
                assert close.error.condition == Condition.CONNECTION_FORCED
        finally:
            stopping.join(10)
        assert not stopping.is_alive(), "a peer that reads nothing held the stop"


def test_stopping_the_broker_closes_an_amqp091_connection_with_320() -> None:
    """An AMQP 0-9-1 client is told too: connection.close 320 CONNECTION_FORCED (as RabbitMQ says it)."""
    with run_in_thread({"server": {"port": 0}}) as running:
        params = pika.URLParameters(running.amqp091_url + "?socket_timeout=5&blocked_connection_timeout=5")
        connection = pika.BlockingConnection(params)
        connection.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(time_limit=5)
    assert closed.value.reply_code == 320


def test_stopping_the_broker_closes_a_connection_before_its_open_with_connection_forced() -> None:
    """A peer that has exchanged protocol headers but not yet sent its open is told why too: the broker's open,
    then its close with amqp:connection:forced (§2.4.1: a close follows an open), not a socket cut silently."""
    with run_in_thread({"server": {"port": 0}}) as running:
        peer = ScriptedPeer.connect(HOST, running.port)
        peer.send_header()
        peer.expect_header()
        running.wait_for(lambda: len(running.connections) == 1)
    with peer:
        peer.expect(Open)
        close = peer.expect(Close)
        assert close.error is not None
        assert close.error.condition == Condition.CONNECTION_FORCED
