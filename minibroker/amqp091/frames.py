"""AMQP 0-9-1 frames (§4.2.3), the protocol header (§4.2.2) and a sans-IO frame reader.

Theory of operation: ``FrameReader.feed`` takes bytes as they arrive, in any split, and returns the complete
frames they finish; it holds back a partial frame until the rest comes. It checks what a frame's first seven
octets already say (a known type, a size within the negotiated ``frame_max``) before waiting for the rest,
so a hostile size is refused at once instead of being buffered. Every fault is a ``ProtocolError`` carrying
its reply code; after one, the reader stays failed and raises the same error again.

``CommandAssembler`` puts a content-carrying method, its header and its body frames back together per
channel (§4.2.6), refusing what arrives out of order with 505 unexpected-frame, as RabbitMQ's
``rabbit_command_assembler`` does. It knows nothing else of channel state (open, closed, flow).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from minibroker.amqp091.base import Method, Properties
from minibroker.amqp091.codec import (
    decode_content_header,
    decode_method,
    encode_content_header_into,
    encode_method_into,
)
from minibroker.amqp091.definitions import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    ReplyCode,
)
from minibroker.amqp091.errors import EncodeError, ProtocolError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
"""§4.2.2: what a 0-9-1 client sends first, and what a server answers a version it does not speak with."""
AMQP_1_0_SASL_HEADER = b"AMQP\x03\x01\x00\x00"
"""What RabbitMQ answers any header it cannot serve that is not a 0-9-x one (``rabbit_reader:refuse_connection``)."""

FRAME_OVERHEAD = 8
"""Frame header (type, channel, size: 7 octets) and frame-end octet: frame-max counts them (§4.2.3)."""
_FRAME_HEAD = struct.Struct(">BHI")
_FRAME_END = bytes([FRAME_END])
HEARTBEAT_BYTES = _FRAME_HEAD.pack(FRAME_HEARTBEAT, 0, 0) + _FRAME_END


# -- the protocol header -------------------------------------------------------------------------------------
class HeaderKind(Enum):
    """What the first eight octets of a connection ask for."""

    AMQP_0_9_1 = "amqp-0-9-1"
    AMQP_1_0 = "amqp-1-0"  # AMQP 1.0, 1.0 TLS or 1.0 SASL: the 1.0 engine's business
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class HeaderVerdict:
    """The answer to a protocol header: which protocol serves it, or the header to answer before closing."""

    kind: HeaderKind
    reply: bytes = b""


def read_protocol_header(header: bytes) -> HeaderVerdict:
    """Classify a connection's first eight octets as RabbitMQ's ``rabbit_reader:version_negotiation`` does.

    ``AMQP 0 0 9 1`` is 0-9-1; ``AMQP 1 1 0 9`` (the 0-9 header: class 1, instance 1, version 0-9) is served
    as 0-9-1 too (the two differ in nothing a client notices); ``AMQP id 1 0 0`` is AMQP 1.0. Any other
    ``AMQP 0 0 minor rev`` with minor >= 9 is answered with the 0-9-1 header (§4.2.2: the server answers
    with a version it supports, then closes); anything else, including an HTTP request or a TLS hello on
    the plain port, is answered with the AMQP 1.0 SASL header, as RabbitMQ does.
    """
    if len(header) != 8:
        raise ValueError(f"a protocol header is 8 octets, not {len(header)}")
    if header[:4] == b"AMQP":
        version = tuple(header[4:])
        if version in ((0, 0, 9, 1), (1, 1, 0, 9)):
            return HeaderVerdict(HeaderKind.AMQP_0_9_1)
        if version[1:] == (1, 0, 0) and version[0] in (0, 2, 3):
            return HeaderVerdict(HeaderKind.AMQP_1_0)
        if version[:2] == (0, 0) and version[2] >= 9:
            return HeaderVerdict(HeaderKind.REFUSED, PROTOCOL_HEADER)
    return HeaderVerdict(HeaderKind.REFUSED, AMQP_1_0_SASL_HEADER)


# -- frames --------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MethodFrame:
    """Type 1: one method (§4.2.4)."""

    channel: int
    method: Method


@dataclass(frozen=True, slots=True)
class HeaderFrame:
    """Type 2: a content header (§4.2.6.1): the class, the body's size and the content properties."""

    channel: int
    class_id: int
    body_size: int
    properties: Properties


@dataclass(frozen=True, slots=True)
class BodyFrame:
    """Type 3: a piece of a content body (§4.2.6.2), opaque bytes."""

    channel: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    """Type 8: a heartbeat (§4.2.7), always on channel 0 with no payload."""

    channel: int = 0


Frame = MethodFrame | HeaderFrame | BodyFrame | HeartbeatFrame


def _wrap(out: bytearray, frame_type: int, channel: int) -> bytes:
    """``out`` (7 octets reserved, then the payload) as one frame."""
    if not 0 <= channel <= 0xFFFF:
        raise EncodeError(f"channel {channel} is not a short")
    _FRAME_HEAD.pack_into(out, 0, frame_type, channel, len(out) - 7)
    out += _FRAME_END
    return bytes(out)


def encode_method_frame(channel: int, method: Method) -> bytes:
    """One method frame."""
    out = bytearray(7)
    encode_method_into(out, method)
    return _wrap(out, FRAME_METHOD, channel)


def encode_content(channel: int, method: Method, properties: Properties, body: bytes, frame_max: int) -> bytes:
    """A content-carrying method with its header frame and its body cut into frames of at most ``frame_max``
    octets (§4.2.6: method, header, then zero or more body frames)."""
    if not method.CONTENT or method.CLASS_ID != properties.CLASS_ID:
        raise EncodeError(f"{method.NAME} carries no content of class {properties.CLASS_ID}")
    if frame_max and frame_max <= FRAME_OVERHEAD:
        raise EncodeError(f"frame-max {frame_max} leaves no room for a body")
    header = bytearray(7)
    encode_content_header_into(header, properties, len(body))
    parts = [encode_method_frame(channel, method), _wrap(header, FRAME_HEADER, channel)]
    step = frame_max - FRAME_OVERHEAD if frame_max else max(len(body), 1)
    parts += (
        _wrap(bytearray(7) + body[start : start + step], FRAME_BODY, channel) for start in range(0, len(body), step)
    )
    return b"".join(parts)


def encode_frame(frame: Frame) -> bytes:
    """Any one frame (a content header or body frame as it is; ``encode_content`` cuts a whole body)."""
    if isinstance(frame, MethodFrame):
        return encode_method_frame(frame.channel, frame.method)
    if isinstance(frame, HeaderFrame):
        out = bytearray(7)
        encode_content_header_into(out, frame.properties, frame.body_size)
        return _wrap(out, FRAME_HEADER, frame.channel)
    if isinstance(frame, BodyFrame):
        return _wrap(bytearray(7) + frame.payload, FRAME_BODY, frame.channel)
    if frame.channel != 0:
        raise EncodeError("a heartbeat frame is on channel 0")
    return HEARTBEAT_BYTES


def _decode_payload(frame_type: int, channel: int, payload: bytes) -> Frame:
    if frame_type == FRAME_METHOD:
        return MethodFrame(channel, decode_method(payload))
    if frame_type == FRAME_HEADER:
        class_id, body_size, properties = decode_content_header(payload)
        return HeaderFrame(channel, class_id, body_size, properties)
    if frame_type == FRAME_BODY:
        return BodyFrame(channel, payload)
    if channel != 0 or len(payload) != 0:
        # §4.2.7: a heartbeat frame is on channel 0 and carries nothing
        raise ProtocolError(ReplyCode.FRAME_ERROR, f"heartbeat on channel {channel} with {len(payload)} octets")
    return HeartbeatFrame()


class FrameReader:
    """Bytes in, frames out, for one connection (after its protocol header).

    ``frame_max`` starts at ``FRAME_MIN_SIZE`` (§4.2.3: until tuned, frames of that size MUST be accepted)
    and is set to the negotiated value after ``connection.tune-ok``; 0 means no limit (§ connection.tune).
    """

    __slots__ = ("_buffer", "_failure", "frame_max")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self.frame_max = frame_max
        self._buffer = bytearray()
        self._failure: ProtocolError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """The frames ``data`` completes, in order; a partial frame stays buffered for the next call."""
        frames, failure = self.feed_until_error(data)
        if failure is not None:
            raise failure
        return frames

    def feed_until_error(self, data: bytes | bytearray | memoryview) -> tuple[list[Frame], ProtocolError | None]:
        """Like ``feed``, but the frames complete before a fault come back with it instead of being lost with
        the exception (a peer's whole publish before its garbage is still handled, as RabbitMQ reads frame by
        frame)."""
        if self._failure is not None:
            return [], self._failure
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        start = 0
        try:
            while len(buffer) - start >= 7:
                frame_type, channel, size = _FRAME_HEAD.unpack_from(buffer, start)
                if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
                    raise ProtocolError(ReplyCode.FRAME_ERROR, f"unknown frame type {frame_type}")
                if self.frame_max and size + FRAME_OVERHEAD > self.frame_max:
                    raise ProtocolError(
                        ReplyCode.FRAME_ERROR,
                        f"a frame of {size + FRAME_OVERHEAD} octets exceeds frame-max {self.frame_max}",
                    )
                end = start + 7 + size
                if len(buffer) <= end:
                    break
                if buffer[end] != FRAME_END:
                    raise ProtocolError(
                        ReplyCode.FRAME_ERROR, f"frame-end octet {buffer[end]:#04x}, not {FRAME_END:#04x}"
                    )
                # a copy, not a view: a view would pin the buffer (and an error's traceback would hold it)
                frames.append(_decode_payload(frame_type, channel, bytes(buffer[start + 7 : end])))
                start = end + 1
        except ProtocolError as exc:
            self._failure = exc
        finally:
            del buffer[:start]
        return frames, self._failure


# -- content assembly ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Command:
    """A method with, when it carries content, its properties and whole body."""

    channel: int
    method: Method
    properties: Properties | None = None
    body: bytes = b""


@dataclass(slots=True)
class _Partial:
    method: Method
    properties: Properties | None = None
    remaining: int = 0
    body: bytearray | None = None


class CommandAssembler:
    """Frames in, commands out, per channel (§4.2.6): a content method, then its header, then body frames
    adding up to the header's body size; any other frame on that channel meanwhile is 505 unexpected-frame.
    Heartbeats are not commands: ``feed`` returns None for them."""

    __slots__ = ("_partial", "max_body_size")

    def __init__(self, max_body_size: int = 2**64 - 1) -> None:
        self.max_body_size = max_body_size
        self._partial: dict[int, _Partial] = {}

    def feed(self, frame: Frame) -> Command | None:
        """The command ``frame`` completes, or None while a content is still arriving (or for a heartbeat)."""
        if isinstance(frame, HeartbeatFrame):
            return None
        channel = frame.channel
        partial = self._partial.get(channel)
        if partial is None:
            if not isinstance(frame, MethodFrame):
                raise ProtocolError(
                    ReplyCode.UNEXPECTED_FRAME, f"a content frame on channel {channel}, no method before it"
                )
            if not frame.method.CONTENT:
                return Command(channel, frame.method)
            self._partial[channel] = _Partial(frame.method)
            return None
        method = partial.method
        if partial.properties is None:
            if not isinstance(frame, HeaderFrame) or frame.class_id != method.CLASS_ID:
                raise self._unexpected(method, f"{method.NAME} must be followed by its content header")
            if frame.body_size > self.max_body_size:
                raise ProtocolError(
                    ReplyCode.FRAME_ERROR,
                    f"a body of {frame.body_size} octets exceeds the maximum of {self.max_body_size}",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
            partial.properties, partial.remaining, partial.body = frame.properties, frame.body_size, bytearray()
        else:
            if not isinstance(frame, BodyFrame):
                raise self._unexpected(method, f"{method.NAME}'s content needs {partial.remaining} more body octets")
            if len(frame.payload) > partial.remaining:
                raise ProtocolError(
                    ReplyCode.FRAME_ERROR,
                    f"a body frame of {len(frame.payload)} octets exceeds the {partial.remaining} the header left",
                    class_id=method.CLASS_ID,
                    method_id=method.METHOD_ID,
                )
            assert partial.body is not None
            partial.body += frame.payload
            partial.remaining -= len(frame.payload)
        if partial.remaining:
            return None
        del self._partial[channel]
        return Command(channel, method, partial.properties, bytes(partial.body or b""))

    def discard(self, channel: int) -> None:
        """Forget a channel's half-received content (the channel closed)."""
        self._partial.pop(channel, None)

    @staticmethod
    def _unexpected(method: Method, text: str) -> ProtocolError:
        return ProtocolError(ReplyCode.UNEXPECTED_FRAME, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)
