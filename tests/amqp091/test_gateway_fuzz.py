"""Hypothesis throws frames at the AMQP 0-9-1 gateway of the real server after a good handshake: well-formed frames
carrying any method with any field values (on channels open or not), content headers and bodies in and out of place,
and raw bytes. Whatever comes, the broker answers with a close or keeps serving (a fresh channel on the same
connection opens), contains no internal error, and a second 0-9-1 client and an AMQP 1.0 client on the same broker
keep working throughout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Message
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.errors import EncodeError
from minibroker.amqp091.frames import BodyFrame, HeaderFrame, HeartbeatFrame, MethodFrame, encode_frame
from minibroker.broker.core import Broker
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.amqp091 import strategies as s091
from tests.amqp091.peer import SocketPeer

pytestmark = pytest.mark.timeout(300)

Proton = tuple[BlockingSender, BlockingReceiver]
PROBE = 100
"""A channel the fuzzed frames never name: opening it shows the connection still serves."""
channels = st.integers(0, 4)
methods = st.sampled_from(sorted(d.METHODS.values(), key=lambda m: (m.CLASS_ID, m.METHOD_ID))).flatmap(s091.method)
PLAUSIBLE: dict[str, st.SearchStrategy[object]] = {
    "queue": st.sampled_from(["fuzz", "", "other", "amq.gen-x"]),
    "exchange": st.sampled_from(["", "amq.direct", "amq.fanout", "amq.topic", "nosuch", "fx"]),
    "destination": st.sampled_from(["fx", "amq.direct", "nosuch"]),
    "source": st.sampled_from(["fx", "amq.fanout", "nosuch"]),
    "routing_key": st.sampled_from(["fuzz", "", "#", "other"]),
    "consumer_tag": st.sampled_from(["a", "b", ""]),
    "delivery_tag": st.integers(0, 6),
    "type": st.sampled_from(["direct", "fanout", "topic", "headers", "bogus"]),
    "prefetch_size": st.sampled_from([0, 0, 0, 1]),
    "prefetch_count": st.integers(0, 3),
    "arguments": st.sampled_from(
        [{}, {}, {"x-max-length": 1}, {"x-message-ttl": 0}, {"x-dead-letter-exchange": "fx"}, {"x-expires": "no"}]
    ),
}
"""Field values that name things the broker has (or nearly), so sequences of methods reach its deeper states."""
CLIENT_CLASSES = (40, 50, 60, 85, 90)


def plausible(cls: type[Method]) -> st.SearchStrategy[Method]:
    return st.builds(cls, **{name: PLAUSIBLE.get(name, s091.WIRE[wire]) for name, wire in cls.FIELDS})


client_methods = st.sampled_from(
    sorted(
        (m for m in d.METHODS.values() if m.CLASS_ID in CLIENT_CLASSES and not m.NAME.endswith("-ok")),
        key=lambda m: (m.CLASS_ID, m.METHOD_ID),
    )
).flatmap(plausible)
frames = st.one_of(
    st.builds(MethodFrame, channels, methods),
    st.builds(MethodFrame, channels, client_methods),
    st.builds(MethodFrame, channels, client_methods),
    st.builds(MethodFrame, channels, st.builds(d.ChannelFlow, st.booleans())),
    st.builds(MethodFrame, channels, st.sampled_from([d.ChannelOpen(), d.ChannelClose(200, "", 0, 0)])),
    st.builds(
        HeaderFrame, channels, st.sampled_from([60, 60, 10, 0]), st.integers(0, 300), s091.properties(d.BasicProperties)
    ),
    st.builds(BodyFrame, channels, st.binary(max_size=300)),
    st.builds(HeartbeatFrame),
)
publishes = st.builds(
    lambda channel, key, properties, body: [
        MethodFrame(channel, d.BasicPublish(routing_key=key)),
        HeaderFrame(channel, 60, len(body), properties),
        BodyFrame(channel, body),
    ],
    channels,
    st.sampled_from(["fuzz", "", "nowhere"]),
    s091.properties(d.BasicProperties),
    st.binary(max_size=50),
)
pieces = st.one_of(*[frames.map(lambda f: [f])] * 4, publishes, publishes, st.binary(min_size=1, max_size=40))


@pytest.fixture(scope="module")
def shared() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as broker:
        yield broker


def encode(piece: object) -> bytes:
    if isinstance(piece, bytes):
        return piece
    assert isinstance(piece, list)
    try:
        return b"".join(encode_frame(frame) for frame in piece)
    except EncodeError:  # a value the codec refuses to write (a too long string, say): no frame, then
        return b""


def probe(peer: SocketPeer) -> None:
    """The connection opens a fresh channel, or closes with a reply code other than 541 (then its close is answered
    and the socket ends)."""
    with contextlib.suppress(OSError):
        peer.method(PROBE, d.ChannelOpen())
    with contextlib.suppress(EOFError, ConnectionError):
        while True:
            frame = peer.frame(timeout=10)
            if isinstance(frame, MethodFrame) and frame.channel == PROBE and isinstance(frame.method, d.ChannelOpenOk):
                return
            if isinstance(frame, MethodFrame) and isinstance(frame.method, d.ConnectionClose):
                assert frame.method.reply_code != d.ReplyCode.INTERNAL_ERROR, frame  # a bug in the gateway
                with contextlib.suppress(OSError):
                    peer.method(0, d.ConnectionCloseOk())
                peer.wait_eof(timeout=10)
                return


def witnesses_work(broker: ThreadedBroker, witness: SocketPeer, proton_client: Proton) -> None:
    witness.publish(1, b"w", routing_key="witness")
    witness.method(1, d.BasicGet(queue="witness", no_ack=True))
    assert witness.content(1, d.BasicGetOk)[2] == b"w"
    sender, receiver = proton_client
    sender.send(Message(body="w"))
    assert receiver.receive(timeout=5).body == "w"
    receiver.accept()
    assert broker._call(lambda core: core.internal_errors) == 0


@pytest.fixture(scope="module")
def witness(shared: ThreadedBroker) -> Iterator[SocketPeer]:
    with SocketPeer(shared.host, shared.port) as peer:
        peer.handshake()
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="witness"), d.QueueDeclareOk)
        yield peer


@pytest.fixture(scope="module")
def proton_client(shared: ThreadedBroker) -> Iterator[Proton]:
    """An AMQP 1.0 client's sender and receiver on one queue."""
    conn = BlockingConnection(shared.url, timeout=10)
    try:
        yield conn.create_sender("witness10"), conn.create_receiver("witness10")
    finally:
        conn.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=st.lists(pieces, min_size=1, max_size=20), opened=st.sets(st.integers(1, 4)), consuming=st.integers(0, 4))
def test_any_frames_after_a_good_handshake(
    shared: ThreadedBroker,
    witness: SocketPeer,
    proton_client: Proton,
    script: list[object],
    opened: set[int],
    consuming: int,
) -> None:
    with SocketPeer(shared.host, shared.port) as peer:
        peer.handshake()
        for number in sorted(opened):
            peer.channel(number)
            peer.call(number, d.QueueDeclare(queue="fuzz"), d.QueueDeclareOk)
            if number == consuming:  # deliveries held, so random acks and nacks meet real ones
                held = peer.call(number, d.QueueDeclare(queue="", exclusive=True), d.QueueDeclareOk).queue
                peer.publish(number, b"held", routing_key=held)
                peer.publish(number, b"held", routing_key=held)
                peer.call(number, d.BasicConsume(queue=held, consumer_tag="a"), d.BasicConsumeOk)
                peer.content(number, d.BasicDeliver)
                peer.content(number, d.BasicDeliver)
        data = b"".join(encode(piece) for piece in script)
        with contextlib.suppress(OSError):
            peer.send(data)
        probe(peer)
    witnesses_work(shared, witness, proton_client)
    assert isinstance(shared._call(lambda core: core), Broker)
