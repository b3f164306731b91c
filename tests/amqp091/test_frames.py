"""Frames, the protocol header, the frame reader's invariants and the content assembler.

The reader's safety invariant (h11's): whatever bytes arrive, in whatever pieces, ``feed`` returns frames or
raises ``ProtocolError``, never anything else and never loops; a valid stream cut anywhere yields the same
frames as in one piece; a frame larger than the negotiated frame-max is refused (501) as soon as its header
says so.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.errors import EncodeError, ProtocolError
from minibroker.amqp091.frames import (
    AMQP_1_0_SASL_HEADER,
    HEARTBEAT_BYTES,
    PROTOCOL_HEADER,
    BodyFrame,
    Command,
    CommandAssembler,
    Frame,
    FrameReader,
    HeaderFrame,
    HeaderKind,
    HeartbeatFrame,
    MethodFrame,
    encode_content,
    encode_frame,
    encode_method_frame,
    read_protocol_header,
)
from tests.amqp091.strategies import method, properties

METHOD_CLASSES = list(d.METHODS.values())


# -- the protocol header --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "kind", "reply"),
    [
        pytest.param(b"AMQP\x00\x00\x09\x01", HeaderKind.AMQP_0_9_1, b"", id="0-9-1"),
        pytest.param(b"AMQP\x01\x01\x00\x09", HeaderKind.AMQP_0_9_1, b"", id="0-9-served-as-0-9-1"),
        pytest.param(b"AMQP\x00\x01\x00\x00", HeaderKind.AMQP_1_0, b"", id="1.0"),
        pytest.param(b"AMQP\x02\x01\x00\x00", HeaderKind.AMQP_1_0, b"", id="1.0-tls"),
        pytest.param(b"AMQP\x03\x01\x00\x00", HeaderKind.AMQP_1_0, b"", id="1.0-sasl"),
        pytest.param(b"AMQP\x00\x00\x09\x00", HeaderKind.REFUSED, PROTOCOL_HEADER, id="0-9-0-offered-0-9-1"),
        pytest.param(b"AMQP\x00\x00\x0a\x00", HeaderKind.REFUSED, PROTOCOL_HEADER, id="0-10-offered-0-9-1"),
        pytest.param(b"AMQP\x01\x01\x08\x00", HeaderKind.REFUSED, AMQP_1_0_SASL_HEADER, id="0-8-refused"),
        pytest.param(b"AMQP\x00\x00\x08\x00", HeaderKind.REFUSED, AMQP_1_0_SASL_HEADER, id="0-0-8-refused"),
        pytest.param(b"GET / HT", HeaderKind.REFUSED, AMQP_1_0_SASL_HEADER, id="http"),
        pytest.param(bytes.fromhex("1603010200010001"), HeaderKind.REFUSED, AMQP_1_0_SASL_HEADER, id="tls-hello"),
    ],
)
def test_protocol_header_verdicts(header: bytes, kind: HeaderKind, reply: bytes) -> None:
    verdict = read_protocol_header(header)
    assert (verdict.kind, verdict.reply) == (kind, reply)


def test_protocol_header_needs_eight_octets() -> None:
    with pytest.raises(ValueError, match="8 octets"):
        read_protocol_header(b"AMQP")


# -- frame errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "text"),
    [
        pytest.param(bytes.fromhex("04" + "0000" + "00000000" + "ce"), "unknown frame type 4", id="unknown-type"),
        pytest.param(bytes.fromhex("01" + "0000" + "00000004" + "005a0014" + "00"), "frame-end", id="bad-frame-end"),
        pytest.param(
            bytes.fromhex("08" + "0001" + "00000000" + "ce"), "heartbeat on channel 1", id="heartbeat-channel-1"
        ),
        pytest.param(bytes.fromhex("08" + "0000" + "00000001" + "00" + "ce"), "heartbeat", id="heartbeat-with-payload"),
        pytest.param(
            bytes.fromhex("01" + "0000" + "00000002" + "005a" + "ce"), "truncated|needed", id="method-payload-short"
        ),
    ],
)
def test_frame_errors_are_501(data: bytes, text: str) -> None:
    with pytest.raises(ProtocolError, match=text) as caught:
        FrameReader().feed(data)
    assert caught.value.reply_code == d.ReplyCode.FRAME_ERROR


def test_the_reader_stays_failed() -> None:
    reader = FrameReader()
    with pytest.raises(ProtocolError) as first:
        reader.feed(bytes.fromhex("04000000000000ce"))
    with pytest.raises(ProtocolError) as again:
        reader.feed(HEARTBEAT_BYTES)
    assert again.value is first.value


def test_a_frame_over_frame_max_is_refused_from_its_header() -> None:
    body = BodyFrame(1, b"x" * (4096 - 8))
    assert FrameReader(frame_max=4096).feed(encode_frame(body)) == [body]  # exactly frame-max: accepted
    too_big = encode_frame(BodyFrame(1, b"x" * (4096 - 7)))
    with pytest.raises(ProtocolError, match="4097 octets exceeds frame-max 4096") as caught:
        FrameReader(frame_max=4096).feed(too_big[:7])  # refused before the payload arrives
    assert caught.value.reply_code == 501


def test_frame_max_starts_at_the_minimum_and_follows_tuning() -> None:
    reader = FrameReader()
    assert reader.frame_max == d.FRAME_MIN_SIZE
    reader.frame_max = 131072
    big = BodyFrame(1, b"y" * 100_000)
    assert reader.feed(encode_frame(big)) == [big]
    with pytest.raises(ProtocolError):
        FrameReader().feed(encode_frame(big))
    assert FrameReader(frame_max=0).feed(encode_frame(big)) == [big]  # 0: no limit (connection.tune)


def test_a_hostile_size_is_not_buffered_for() -> None:
    with pytest.raises(ProtocolError, match="exceeds frame-max"):
        FrameReader(frame_max=131072).feed(bytes.fromhex("03" + "0001" + "ffffffff"))


# -- encoding -------------------------------------------------------------------------------------------------
def test_heartbeat_bytes() -> None:
    assert HEARTBEAT_BYTES.hex() == "08" + "0000" + "00000000" + "ce"
    assert encode_frame(HeartbeatFrame()) == HEARTBEAT_BYTES
    assert FrameReader().feed(HEARTBEAT_BYTES) == [HeartbeatFrame()]


def test_content_is_cut_at_frame_max() -> None:
    data = encode_content(5, d.BasicPublish(routing_key="q"), d.BasicProperties(), b"z" * 10_000, frame_max=4096)
    frames = FrameReader().feed(data)
    assert [type(f) for f in frames] == [MethodFrame, HeaderFrame, BodyFrame, BodyFrame, BodyFrame]
    assert [len(f.payload) for f in frames if isinstance(f, BodyFrame)] == [4088, 4088, 1824]
    assert isinstance(frames[1], HeaderFrame)
    assert frames[1].body_size == 10_000
    empty = FrameReader().feed(encode_content(5, d.BasicPublish(), d.BasicProperties(), b"", frame_max=4096))
    assert [type(f) for f in empty] == [MethodFrame, HeaderFrame]  # an empty body: no body frame
    whole = FrameReader(frame_max=0).feed(encode_content(5, d.BasicPublish(), d.BasicProperties(), b"w" * 9000, 0))
    assert [len(f.payload) for f in whole if isinstance(f, BodyFrame)] == [9000]  # frame-max 0: no limit, one frame


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(
            lambda: encode_content(1, d.BasicAck(), d.BasicProperties(), b"", 4096),
            "carries no content",
            id="no-content",
        ),
        pytest.param(
            lambda: encode_content(1, d.BasicPublish(), d.BasicProperties(), b"x", 8), "no room", id="frame-max-8"
        ),
        pytest.param(lambda: encode_method_frame(65536, d.TxCommit()), "channel", id="channel-too-large"),
        pytest.param(lambda: encode_frame(HeartbeatFrame(channel=1)), "channel 0", id="heartbeat-channel"),
        pytest.param(
            lambda: encode_frame(HeaderFrame(1, 60, -1, d.BasicProperties())), "body size", id="negative-size"
        ),
        pytest.param(
            lambda: encode_frame(HeaderFrame(1, 60, 0, d.BasicProperties(priority=256))), "priority", id="priority-256"
        ),
    ],
)
def test_encoding_misuse_raises_encode_error(call: Any, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        call()


# -- invariants (hypothesis) -----------------------------------------------------------------------------------
def feed_all(chunks: list[bytes], frame_max: int = 0) -> list[Frame]:
    reader = FrameReader(frame_max=frame_max)
    return [frame for chunk in chunks for frame in reader.feed(chunk)]


READER_CODES = {
    d.ReplyCode.FRAME_ERROR,
    d.ReplyCode.SYNTAX_ERROR,
    d.ReplyCode.COMMAND_INVALID,
    d.ReplyCode.UNEXPECTED_FRAME,
}


def feeds_or_raises_protocol_error(chunks: list[bytes], frame_max: int) -> None:
    """Feed ``chunks``: frames, or a ``ProtocolError`` with one of the reader's hard reply codes, nothing else."""
    failure: ProtocolError | None = None
    try:
        feed_all(chunks, frame_max)
    except ProtocolError as exc:
        failure = exc
    assert failure is None or (failure.reply_code in READER_CODES and failure.hard)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40), max_size=6), st.sampled_from([0, 4096, 16]))
def test_arbitrary_bytes_raise_only_protocol_error(chunks: list[bytes], frame_max: int) -> None:
    feeds_or_raises_protocol_error(chunks, frame_max)


@st.composite
def framed_soup(draw: st.DrawFn) -> bytes:
    """Well-framed frames (a known type, a right size, the frame-end octet) around arbitrary payloads that
    start like a method or a content header: reaches the payload decoders rather than the framing checks."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 4))):
        frame_type = draw(st.sampled_from([1, 2, 3, 8]))
        if frame_type == 1:
            cls = draw(st.sampled_from(METHOD_CLASSES))
            prefix = cls.CLASS_ID.to_bytes(2, "big") + cls.METHOD_ID.to_bytes(2, "big")
        elif frame_type == 2:
            prefix = bytes.fromhex("003c0000") + draw(st.binary(min_size=8, max_size=8))
        else:
            prefix = b""
        payload = prefix + draw(st.binary(max_size=40))
        out += bytes([frame_type]) + draw(st.integers(0, 2)).to_bytes(2, "big") + len(payload).to_bytes(4, "big")
        out += payload + b"\xce"
    return bytes(out)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(framed_soup())
def test_framed_garbage_raises_only_protocol_error(data: bytes) -> None:
    feeds_or_raises_protocol_error([data], 0)


@st.composite
def valid_streams(draw: st.DrawFn) -> bytes:
    """A stream of valid frames: methods, whole contents cut at a small frame-max, heartbeats."""
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        channel = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["method", "content", "heartbeat"]))
        if kind == "method":
            parts.append(encode_method_frame(channel, draw(method(draw(st.sampled_from(METHOD_CLASSES))))))
        elif kind == "content":
            props = draw(properties(d.BasicProperties).filter(lambda p: len(repr(p)) < 1500))
            body = draw(st.binary(max_size=300))
            parts.append(encode_content(channel, d.BasicPublish(routing_key="q"), props, body, frame_max=4096))
        else:
            parts.append(HEARTBEAT_BYTES)
    return b"".join(parts)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_streams()))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "extreme"]))
        if action == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data.insert(i, draw(st.integers(0, 255)))
        elif action == "delete" and len(data) > 1:
            del data[i]
        else:
            data[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xCE, 0xFF]))
    return bytes(data)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_streams())
def test_mutated_streams_raise_only_protocol_error(data: bytes) -> None:
    feeds_or_raises_protocol_error([data], 4096)


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(data=valid_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_a_stream_cut_anywhere_gives_the_same_frames(data: bytes, cuts: list[int]) -> None:
    whole = feed_all([data], frame_max=4096)
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert feed_all(chunks, frame_max=4096) == whole
    assert feed_all([data[i : i + 1] for i in range(len(data))], frame_max=4096) == whole
    assert b"".join(encode_frame(f) for f in whole) == data  # and they encode back to the same bytes


# -- content assembly (505 unexpected-frame) -------------------------------------------------------------------
PUBLISH = MethodFrame(1, d.BasicPublish(routing_key="q"))
HEADER = HeaderFrame(1, 60, 3, d.BasicProperties(delivery_mode=2))


def test_assembler_puts_content_together_per_channel() -> None:
    assembler = CommandAssembler()
    assert assembler.feed(PUBLISH) is None
    assert assembler.feed(MethodFrame(2, d.TxCommit())) == Command(2, d.TxCommit())  # other channels go on
    assert assembler.feed(HEADER) is None
    assert assembler.feed(HeartbeatFrame()) is None
    assert assembler.feed(BodyFrame(1, b"ab")) is None
    assert assembler.feed(BodyFrame(1, b"c")) == Command(1, PUBLISH.method, HEADER.properties, b"abc")
    assert assembler.feed(PUBLISH) is None
    assert assembler.feed(HeaderFrame(1, 60, 0, d.BasicProperties())) == Command(
        1, PUBLISH.method, d.BasicProperties(), b""
    )


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        pytest.param([BodyFrame(1, b"x")], 505, id="body-without-method"),
        pytest.param([HEADER], 505, id="header-without-method"),
        pytest.param([PUBLISH, MethodFrame(1, d.TxCommit())], 505, id="method-instead-of-header"),
        pytest.param([PUBLISH, BodyFrame(1, b"x")], 505, id="body-instead-of-header"),
        pytest.param([PUBLISH, HEADER, MethodFrame(1, d.TxCommit())], 505, id="method-inside-body"),
        pytest.param([PUBLISH, HEADER, HEADER], 505, id="second-header"),
        pytest.param([PUBLISH, HEADER, BodyFrame(1, b"abcd")], 501, id="body-longer-than-header-said"),
        pytest.param([PUBLISH, HeaderFrame(1, 60, 11, d.BasicProperties())], 501, id="body-over-maximum"),
    ],
)
def test_assembler_refuses_frames_out_of_order(frames: list[Frame], code: int) -> None:
    assembler = CommandAssembler(max_body_size=10)
    for frame in frames[:-1]:
        assert assembler.feed(frame) is None
    with pytest.raises(ProtocolError) as caught:
        assembler.feed(frames[-1])
    assert caught.value.reply_code == code


def test_assembler_discards_a_closed_channels_content() -> None:
    assembler = CommandAssembler()
    assembler.feed(PUBLISH)
    assembler.discard(1)
    assert assembler.feed(MethodFrame(1, d.TxCommit())) == Command(1, d.TxCommit())


def test_feed_until_error_returns_the_frames_before_the_fault() -> None:
    reader = FrameReader()
    frames, failure = reader.feed_until_error(HEARTBEAT_BYTES + encode_method_frame(1, d.TxSelect()) + b"\x09" * 8)
    assert frames == [HeartbeatFrame(), MethodFrame(1, d.TxSelect())]
    assert failure is not None
    assert failure.reply_code == d.ReplyCode.FRAME_ERROR
    assert reader.feed_until_error(HEARTBEAT_BYTES) == ([], failure)  # stays failed
    with pytest.raises(ProtocolError) as info:
        reader.feed(b"")
    assert info.value is failure
