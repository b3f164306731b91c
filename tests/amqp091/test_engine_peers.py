"""``Connection091`` against peers it did not write: pika's own frame codec (``pika.frame``, ``pika.spec``) as
a client in memory, and hypothesis's arbitrary bytes after a good handshake (h11's invariant: whatever arrives,
``receive_data`` returns events, never raises, and the connection either goes on or ends in a close)."""

from __future__ import annotations

from typing import Any

import pika.credentials
import pika.frame
import pika.spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.engine import Phase
from minibroker.amqp091.events import (
    ChannelClosed,
    ChannelOpened,
    CommandReceived,
    ConnectionClosed,
    CredentialsReceived,
    OpenRequested,
)
from minibroker.amqp091.frames import MethodFrame, encode_content, encode_frame, encode_method_frame
from tests.amqp091.peer import Peer
from tests.amqp091.strategies import method, properties


class PikaClient:
    """pika's frame marshalling and decoding as the client end of an in-memory wire."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self._buffer = b""

    def send(self, *frames: Any) -> list[Any]:
        return self.peer.send(b"".join(frame.marshal() for frame in frames))

    def receive(self) -> list[Any]:
        self._buffer += self.peer.engine.data_to_send()
        frames = []
        while self._buffer:
            consumed, frame = pika.frame.decode_frame(self._buffer)
            assert consumed, "pika found a partial frame"
            self._buffer = self._buffer[consumed:]
            frames.append(frame)
        return frames

    def method(self) -> Any:
        (frame,) = self.receive()
        assert isinstance(frame, pika.frame.Method)
        return frame.method


def test_pika_handshake_publish_deliver_and_close() -> None:
    peer = Peer()
    client = PikaClient(peer)
    assert client.send(pika.frame.ProtocolHeader()) == []
    start = client.method()
    assert isinstance(start, pika.spec.Connection.Start)
    assert start.mechanisms == b"PLAIN AMQPLAIN"
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    mechanism, response = pika.credentials.PlainCredentials("guest", "s3cret").response_for(start)
    assert mechanism is not None
    start_ok = pika.spec.Connection.StartOk({"product": "pika"}, mechanism, response, "en_US")
    assert client.send(pika.frame.Method(0, start_ok)) == [CredentialsReceived("PLAIN", "guest")]
    assert peer.engine.take_credentials() == ("guest", "s3cret")
    peer.engine.login_verdict(True)
    tune = client.method()
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    tune_ok = pika.spec.Connection.TuneOk(tune.channel_max, tune.frame_max, tune.heartbeat)
    assert client.send(pika.frame.Method(0, tune_ok), pika.frame.Method(0, pika.spec.Connection.Open("/"))) == [
        OpenRequested("/")
    ]
    peer.engine.open_ok()
    assert isinstance(client.method(), pika.spec.Connection.OpenOk)

    assert client.send(pika.frame.Method(1, pika.spec.Channel.Open())) == [ChannelOpened(1)]
    assert isinstance(client.method(), pika.spec.Channel.OpenOk)
    publish = pika.spec.Basic.Publish(exchange="amq.topic", routing_key="a.b")
    props = pika.spec.BasicProperties(content_type="text/plain", headers={"k": "v"}, delivery_mode=2)
    events = client.send(
        pika.frame.Method(1, publish),
        pika.frame.Header(1, 5, props),
        pika.frame.Body(1, b"he"),
        pika.frame.Body(1, b"llo"),
    )
    assert len(events) == 1
    assert isinstance(events[0], CommandReceived)
    assert events[0].method == d.BasicPublish(0, "amq.topic", "a.b", False, False)
    assert events[0].body == b"hello"
    assert events[0].properties is not None
    assert (events[0].properties.content_type, events[0].properties.delivery_mode) == ("text/plain", 2)
    assert events[0].properties.headers == {"k": "v"}

    peer.engine.send_content(
        1, d.BasicDeliver("ctag", 1, False, "amq.topic", "a.b"), d.BasicProperties(message_id="m1"), b"x" * 300_000
    )
    frames = client.receive()
    assert isinstance(frames[0].method, pika.spec.Basic.Deliver)
    assert frames[0].method.consumer_tag == "ctag"
    assert frames[1].body_size == 300_000
    assert frames[1].properties.message_id == "m1"
    assert b"".join(frame.fragment for frame in frames[2:]) == b"x" * 300_000
    assert len(frames) == 2 + 3  # 131072-octet frames: 131064 + 131064 + 37872

    close = pika.spec.Channel.Close(200, "bye", 0, 0)
    assert client.send(pika.frame.Method(1, close)) == [ChannelClosed(1, 200, "bye", by_peer=True)]
    assert isinstance(client.method(), pika.spec.Channel.CloseOk)
    events = client.send(pika.frame.Method(0, pika.spec.Connection.Close(200, "Normal shutdown", 0, 0)))
    assert events == [ConnectionClosed(200, "Normal shutdown", by_peer=True)]
    assert isinstance(client.method(), pika.spec.Connection.CloseOk)
    assert peer.engine.finished


def test_pika_reads_our_refusal_as_a_close() -> None:
    peer = Peer()
    client = PikaClient(peer)
    client.send(pika.frame.ProtocolHeader())
    client.method()
    client.send(pika.frame.Method(0, pika.spec.Connection.StartOk({}, "PLAIN", b"\0guest\0bad", "en_US")))
    peer.engine.take_credentials()
    peer.engine.login_verdict(False)
    close = client.method()
    assert isinstance(close, pika.spec.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused")


# -- arbitrary bytes after a good handshake -------------------------------------------------------------------
_CHANNEL_SAFE = [cls for cls in d.METHODS.values() if cls.CLASS_ID not in (10,)]
valid_frames = st.one_of(
    st.builds(encode_method_frame, st.integers(0, 3), st.sampled_from(_CHANNEL_SAFE).flatmap(method)),
    st.builds(
        lambda channel, publish, props, body: encode_content(channel, publish, props, body, 4096),
        st.integers(1, 3),
        method(d.BasicPublish),
        properties(d.BasicProperties),
        st.binary(max_size=5000),
    ),
)
chunks = st.lists(st.one_of(st.binary(max_size=40), valid_frames), max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=chunks, cut=st.integers(1, 64))
def test_arbitrary_bytes_never_raise_and_end_in_a_close_or_go_on(chunks: list[bytes], cut: int) -> None:
    peer = Peer(max_message_size=3000)
    peer.open(channels=(1,), frame_max=4096)
    data = b"".join(chunks)
    closed = []
    for start in range(0, len(data), cut):
        closed += [e for e in peer.send(data[start : start + cut]) if isinstance(e, ConnectionClosed)]
        if peer.engine.finished:
            break
    frames = peer.frames()  # whatever we sent is well-formed 0-9-1
    closes = [f for f in frames if isinstance(f, MethodFrame) and isinstance(f.method, d.ConnectionClose)]
    if peer.engine.phase is Phase.OPEN:
        assert closed == []
        assert closes == []
    else:
        # a hard error: exactly one connection.close, the last frame we sent, with a hard code; then
        # close-ok ends it (or, the stream being out of step after a framing error, any further bytes do)
        assert peer.engine.phase in (Phase.CLOSING, Phase.FINISHED)
        assert len(closed) == 1
        assert len(closes) == 1
        assert frames[-1] == closes[0]
        assert closes[0].method.reply_code in d.HARD_ERRORS
        assert closed[0].reply_code == closes[0].method.reply_code
        assert peer.send(encode_frame(MethodFrame(0, d.ConnectionCloseOk()))) == []
        assert peer.engine.finished


handshake_frames = st.one_of(
    st.binary(max_size=30),
    st.builds(encode_method_frame, st.integers(0, 2), st.sampled_from(list(d.METHODS.values())).flatmap(method)),
    st.builds(
        encode_method_frame,
        st.just(0),
        st.builds(
            d.ConnectionStartOk,
            st.just({}),
            st.sampled_from(["PLAIN", "AMQPLAIN", "EXTERNAL"]),
            st.sampled_from([b"\0guest\0guest", b"", b"\0\0", b"\x05LOGINS\x00\x00\x00\x01a"]),
        ),
    ),
    st.builds(
        encode_method_frame,
        st.just(0),
        st.builds(d.ConnectionTuneOk, st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1), st.integers(0, 0xFFFF)),
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=st.lists(handshake_frames, max_size=6), verdict=st.booleans(), times=st.lists(st.floats(0, 100)))
def test_arbitrary_handshakes_never_raise(chunks: list[bytes], verdict: bool, times: list[float]) -> None:
    """From the protocol header on, whatever arrives (and whenever the clock fires) the engine answers with
    well-formed frames and never raises; a connection that ends has reported ``ConnectionClosed`` once."""
    peer = Peer(heartbeat=5)
    peer.send(b"AMQP\x00\x00\x09\x01")
    closed = []
    for chunk, now in zip(chunks, sorted(times) + [100.0] * len(chunks), strict=False):
        closed += [e for e in peer.send(chunk) if isinstance(e, ConnectionClosed)]
        if peer.engine.phase is Phase.LOGIN:
            peer.engine.take_credentials()
            peer.engine.login_verdict(verdict)
        if peer.engine.phase is Phase.OPENING:
            peer.engine.open_ok()
        closed += [e for e in peer.tick(max(now, peer.now)) if isinstance(e, ConnectionClosed)]
    closed += [e for e in peer.engine.take_events() if isinstance(e, ConnectionClosed)]
    peer.frames()  # well-formed
    assert len(closed) == (1 if peer.engine.phase in (Phase.CLOSING, Phase.FINISHED) else 0)
