"""Server end of one AMQP 0-9-1 connection, sans-IO (0-9-1 §2.2.4 connection and channel life, §4.2 framing).

Theory of operation
-------------------
Bytes go in through ``receive_data(data, now)`` (``b""``: the socket ended) and come back as events; frames to
send gather in an output buffer that ``data_to_send()`` drains; time only arrives as ``now`` (``handle_timeout``
at ``next_deadline()``). The engine owns the handshake (protocol header, start / start-ok, tune / tune-ok,
open / open-ok), heartbeats, connection.close and the life of channels (open, flow, close both ways), and puts
content-carrying methods back together. Every other method (classes exchange, queue, basic, confirm, tx) goes
to the embedder uninterpreted as ``CommandReceived``; the embedder answers with ``send_method`` /
``send_content``. Commands from the embedder only queue frames; the events they cause (``ChannelClosed`` /
``ConnectionClosed`` when we close) come out of the next ``receive_data`` / ``handle_timeout`` / ``take_events``.

Login: the engine parses PLAIN and AMQPLAIN responses but decides nothing: it reports ``CredentialsReceived``,
hands the user and password over once (``take_credentials``) and waits for ``login_verdict``; likewise
``OpenRequested`` waits for ``open_ok`` (or ``close``, e.g. 530 for an unknown vhost).

Errors: whatever the peer sends never raises out of ``receive_data``. A fault is a ``ProtocolError`` inside the
engine; a hard one (§1.3 of the XML: 501-506, 530, 540, 541) sends connection.close with its code, class-id
and method-id, a soft one channel.close. After our connection.close everything but connection.close /
close-ok is discarded until close-ok (or ``close_timeout``), then ``finished``; after our channel.close the
same holds for that channel (spec, channel.close: "MUST discard all methods ... except Close and Close-OK").

Where we follow RabbitMQ (``rabbit_reader.erl``, ``rabbit_channel.erl``) and where not:
- a method out of order in the handshake is 503 COMMAND_INVALID (the spec's meaning; RabbitMQ says 504
  "unexpected method in connection state"), a frame on a channel other than 0 before open-ok 505;
- an unknown mechanism is 503 "unknown authentication mechanism" (``auth_mechanism_to_module``); a malformed
  response and a refused login are 403 ACCESS_REFUSED with RabbitMQ's safe text (``auth_fail``). RabbitMQ
  drops the socket silently for the first two while "starting"; we send the close, which clients report better;
- tune-ok's frame_max and channel_max are checked as ``validate_negotiated_integer_value`` does (530 with its
  text, class/method connection.tune), except channel_max 0, which means ours (the design's choice);
- heartbeats (``rabbit_heartbeat.erl``): we send one when we have sent nothing for half the interval, as its
  sender does; a peer that sent nothing for two intervals is dropped without a close frame, as its receiver
  makes RabbitMQ do; the handshake time-out drops the socket likewise (``handle_other(handshake_timeout, ...)``);
- a peer's frame may exceed frame_max by 8 octets (``FRAME_SIZE_FUDGE``), beyond that 501;
- a body over ``max_message_size`` is 406 PRECONDITION_FAILED on the channel (``rabbit_channel:check_msg_size``),
  found from the content header, before any body is buffered.
"""

from __future__ import annotations

import struct
from enum import Enum
from typing import Any

from minibroker.amqp091.base import Method
from minibroker.amqp091.codec import decode_table
from minibroker.amqp091.definitions import (
    FRAME_MIN_SIZE,
    BasicProperties,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ReplyCode,
)
from minibroker.amqp091.errors import LocalProtocolError, ProtocolError
from minibroker.amqp091.events import (
    ChannelClosed,
    ChannelOpened,
    CommandReceived,
    ConnectionClosed,
    CredentialsReceived,
    Event,
    FlowRequested,
    OpenRequested,
)
from minibroker.amqp091.frames import (
    HEARTBEAT_BYTES,
    PROTOCOL_HEADER,
    BodyFrame,
    CommandAssembler,
    Frame,
    FrameReader,
    HeaderFrame,
    HeaderKind,
    HeartbeatFrame,
    MethodFrame,
    encode_content,
    encode_method_frame,
    read_protocol_header,
)

CONNECTION_CLASS = 10
CHANNEL_CLASS = 20
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
"""RabbitMQ's default ``max_message_size`` (128 MiB)."""
FRAME_SIZE_FUDGE = 8
"""How far over frame_max a peer's frame may go (``rabbit_reader``'s ``FRAME_SIZE_FUDGE``: clients often count
frame_max without the frame's own 8 octets, and RabbitMQ lets them)."""
CLOSE_TIMEOUT = 30.0
"""How long our connection.close waits for close-ok (``rabbit_reader``'s ``CLOSING_TIMEOUT``)."""

DEFAULT_CAPABILITIES: dict[str, Any] = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": False,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}
"""connection.start's capabilities (RabbitMQ's ``server_capabilities``); the embedder overrides them through
``server_properties["capabilities"]`` as it honours more."""

_LENGTH = struct.Struct(">I")


class Phase(Enum):
    """Where the connection is: the handshake's steps (§2.2.4), open, closing, over."""

    HEADER = "header"  # waiting for the protocol header
    STARTING = "starting"  # connection.start sent, waiting for start-ok
    LOGIN = "login"  # credentials reported, waiting for login_verdict
    TUNING = "tuning"  # connection.tune sent, waiting for tune-ok
    AWAITING_OPEN = "awaiting-open"  # tuned, waiting for connection.open
    OPENING = "opening"  # OpenRequested reported, waiting for open_ok
    OPEN = "open"
    CLOSING = "closing"  # our connection.close sent, waiting for close-ok
    FINISHED = "finished"


_EXPECTED: dict[Phase, type[Method]] = {
    Phase.STARTING: ConnectionStartOk,
    Phase.TUNING: ConnectionTuneOk,
    Phase.AWAITING_OPEN: ConnectionOpen,
}
_HANDSHAKE = frozenset({Phase.HEADER, Phase.STARTING, Phase.LOGIN, Phase.TUNING, Phase.AWAITING_OPEN, Phase.OPENING})
_TUNED = frozenset({Phase.AWAITING_OPEN, Phase.OPENING, Phase.OPEN})


def _shortstr(text: str) -> str:
    """``text`` cut to a shortstr's 255 UTF-8 octets. Reply texts quote the peer's names, which the codec reads
    with surrogate escapes for invalid UTF-8: they go back as the same octets (any other lone surrogate as
    "?"), so the text always encodes."""
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "replace")
    return data[:255].decode("utf-8", "surrogateescape")


def refused_login_text(mechanism: str) -> str:
    """RabbitMQ's reply text for a refused login (``rabbit_reader:auth_fail``, authentication_failure_close)."""
    return (
        f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile."
    )


def parse_credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """The user and password of a start-ok response, or None when it is malformed.

    PLAIN (RFC 4616 as ``rabbit_auth_mechanism_plain`` reads it): an empty authorisation id, NUL, user, NUL,
    password. AMQPLAIN (``rabbit_auth_mechanism_amqplain``): a field table without its size prefix, holding
    string fields LOGIN and PASSWORD. Both must be UTF-8 without NUL (they go on as SASL PLAIN).
    """
    raw_user: Any
    raw_password: Any
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3 or parts[0]:
            return None
        raw_user, raw_password = parts[1], parts[2]
    else:
        try:
            table = decode_table(_LENGTH.pack(len(response)) + response)
        except ProtocolError:
            return None
        raw_user, raw_password = table.get("LOGIN"), table.get("PASSWORD")
    values: list[str] = []
    for raw in (raw_user, raw_password):
        try:
            if isinstance(raw, str):  # the codec reads invalid UTF-8 with surrogate escapes: back to the octets
                raw = raw.encode("utf-8", "surrogateescape")
            if not isinstance(raw, bytes) or b"\0" in raw:
                return None
            values.append(raw.decode())
        except UnicodeError:
            return None
    return values[0], values[1]


class Connection091:
    """Server end of one AMQP 0-9-1 connection: bytes in, events out, time passed in."""

    def __init__(
        self,
        *,
        now: float,
        frame_max: int = 131072,
        channel_max: int = 2047,
        heartbeat: int = 60,
        handshake_timeout: float = 10.0,
        server_properties: dict[str, Any] | None = None,
        mechanisms: tuple[str, ...] = ("PLAIN", "AMQPLAIN"),
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        close_timeout: float = CLOSE_TIMEOUT,
    ) -> None:
        unknown = set(mechanisms) - {"PLAIN", "AMQPLAIN"}
        if unknown:
            raise ValueError(f"mechanisms the engine cannot parse: {sorted(unknown)}")
        self.phase = Phase.HEADER
        self.frame_max = frame_max  # ours until tune-ok, then the negotiated one
        self.channel_max = channel_max
        self.heartbeat = heartbeat  # the interval offered until tune-ok, then the peer's choice (0: none)
        self.mechanisms = mechanisms
        self.close_timeout = close_timeout
        self.client_properties: dict[str, Any] = {}
        self.mechanism = ""
        self.vhost = ""
        self.server_properties = _server_properties(server_properties)
        self._now = now
        self._handshake_deadline = now + handshake_timeout
        self._close_deadline = 0.0
        self._last_received = now
        self._last_sent = now
        self._header = b""
        self._reader = FrameReader(FRAME_MIN_SIZE + FRAME_SIZE_FUDGE)
        self._assembler = CommandAssembler(max_message_size)
        self._channels: dict[int, bool] = {}  # open channels: True; closing (our close sent): False
        self._credentials: tuple[str, str] | None = None
        self._out = bytearray()
        self._events: list[Event] = []
        self._reported_close = False

    # -- I/O side -------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """True when the connection is over: flush ``data_to_send`` and close the socket."""
        return self.phase is Phase.FINISHED

    @property
    def closing(self) -> bool:
        """True once the connection is ending (our close sent, or over)."""
        return self.phase is Phase.CLOSING or self.phase is Phase.FINISHED

    def is_channel_open(self, channel: int) -> bool:
        """True while ``channel`` is open: opened and not closed by either side (a channel we closed is not)."""
        return self.phase is Phase.OPEN and self._channels.get(channel, False)

    def data_to_send(self) -> bytes:
        """Take every byte queued for the peer."""
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def has_output(self) -> bool:
        """True when ``data_to_send`` would return something."""
        return bool(self._out)

    @property
    def output_size(self) -> int:
        """Bytes ``data_to_send`` would return (the I/O layer stops reading a peer that lets them pile up)."""
        return len(self._out)

    def receive_data(self, data: bytes | bytearray, now: float) -> list[Event]:
        """Feed bytes from the peer (``b""``: the socket ended); return what happened."""
        self._now = now
        if self.phase is Phase.FINISHED:
            return self.take_events()
        if not data:
            self._drop(ReplyCode.CONNECTION_FORCED, "the peer closed the socket", by_peer=True)
            return self.take_events()
        self._last_received = now
        try:
            if self.phase is Phase.HEADER:
                data = self._read_header(data)
            if data and not self.finished:
                frames, failure = self._reader.feed_until_error(data)
                for frame in frames:
                    self._on_frame(frame)
                    if self.finished:
                        break
                if failure is not None:
                    raise failure
        except ProtocolError as exc:
            self._fail(exc)
        return self.take_events()

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` has work: the handshake's end, our close's time-out, a heartbeat to send
        or the peer's silence to judge; None when nothing is timed."""
        if self.phase is Phase.FINISHED:
            return None
        if self.phase is Phase.CLOSING:
            return self._close_deadline
        deadlines = []
        if self.phase in _HANDSHAKE:
            deadlines.append(self._handshake_deadline)
        if self.heartbeat and self.phase in _TUNED:
            deadlines += [self._last_sent + self.heartbeat / 2, self._last_received + 2 * self.heartbeat]
        return min(deadlines, default=None)

    def handle_timeout(self, now: float) -> list[Event]:
        """Act on the deadlines ``now`` has reached; return what happened."""
        self._now = now
        if self.phase is Phase.CLOSING and now >= self._close_deadline:
            self.phase = Phase.FINISHED
        elif self.phase in _HANDSHAKE and now >= self._handshake_deadline:
            self._drop(ReplyCode.CONNECTION_FORCED, "handshake timed out", by_peer=False)
        elif self.heartbeat and self.phase in _TUNED:
            if now >= self._last_received + 2 * self.heartbeat:
                self._drop(
                    ReplyCode.CONNECTION_FORCED,
                    f"missed heartbeats from client, timeout: {self.heartbeat}s",
                    by_peer=False,
                )
            elif now >= self._last_sent + self.heartbeat / 2:
                self._write(HEARTBEAT_BYTES)
        return self.take_events()

    def take_events(self) -> list[Event]:
        """The events caused since the last call (those of the embedder's own commands included)."""
        events, self._events = self._events, []
        return events

    # -- the embedder's answers -----------------------------------------------------------------------------
    def take_credentials(self) -> tuple[str, str]:
        """The user and password of ``CredentialsReceived``, once; answer with ``login_verdict``."""
        if self._credentials is None:
            raise LocalProtocolError("no credentials are waiting to be checked")
        credentials, self._credentials = self._credentials, None
        return credentials

    def login_verdict(self, ok: bool) -> None:
        """Answer the credentials: ok sends connection.tune, else connection.close 403 ACCESS_REFUSED. Ignored
        once the connection is ending (it may time out or drop while the password is checked)."""
        if self.phase in (Phase.CLOSING, Phase.FINISHED):
            return
        if self.phase is not Phase.LOGIN:
            raise LocalProtocolError(f"no login verdict is awaited in phase {self.phase.value}")
        self._credentials = None
        if not ok:
            self.close(ReplyCode.ACCESS_REFUSED, refused_login_text(self.mechanism))
            return
        self.phase = Phase.TUNING
        self._send(0, ConnectionTune(self.channel_max, self.frame_max, self.heartbeat))

    def open_ok(self) -> None:
        """Answer ``OpenRequested``: connection.open-ok; the connection is open."""
        if self.phase in (Phase.CLOSING, Phase.FINISHED):
            return
        if self.phase is not Phase.OPENING:
            raise LocalProtocolError(f"no connection.open is awaiting an answer in phase {self.phase.value}")
        self.phase = Phase.OPEN
        self._send(0, ConnectionOpenOk())

    def send_method(self, channel: int, method: Method) -> None:
        """Send a method without content on an open channel (dropped if the channel is closing or gone)."""
        if method.CONTENT:
            raise LocalProtocolError(f"{method.NAME} carries content: use send_content")
        if self._may_send(channel, method):
            self._send(channel, method)

    def send_content(self, channel: int, method: Method, properties: BasicProperties, body: bytes) -> None:
        """Send a content-carrying method (basic.deliver, basic.get-ok, basic.return) with its header and its
        body cut to the negotiated frame_max (§4.2.6); dropped if the channel is closing or gone."""
        if not method.CONTENT:
            raise LocalProtocolError(f"{method.NAME} carries no content: use send_method")
        if self._may_send(channel, method):
            self._write(encode_content(channel, method, properties, body, self.frame_max))

    def close_channel(self, channel: int, code: ReplyCode, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Send channel.close and report ``ChannelClosed`` at once; the peer's frames on the channel are then
        discarded until its close-ok frees the number. Ignored for a channel not open."""
        if not self.is_channel_open(channel):
            return
        text = _shortstr(text)
        self._channels[channel] = False
        self._assembler.discard(channel)
        self._send(channel, ChannelClose(code, text, class_id, method_id))
        self._events.append(ChannelClosed(channel, code, text, by_peer=False))

    def close(self, code: ReplyCode, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Send connection.close and report ``ConnectionClosed`` at once; then everything but close / close-ok
        is discarded until close-ok or ``close_timeout``. Before the protocol header: just finish."""
        if self.phase in (Phase.CLOSING, Phase.FINISHED):
            return
        text = _shortstr(text)
        if self.phase is Phase.HEADER:
            self._drop(code, text, by_peer=False)
            return
        self._send(0, ConnectionClose(code, text, class_id, method_id))
        self.phase = Phase.CLOSING
        self._close_deadline = self._now + self.close_timeout
        self._channels.clear()
        self._credentials = None
        self._report_close(code, text, by_peer=False)

    # -- internals ------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        self._out += data
        self._last_sent = self._now

    def _send(self, channel: int, method: Method) -> None:
        self._write(encode_method_frame(channel, method))

    def _may_send(self, channel: int, method: Method) -> bool:
        if method.CLASS_ID in (CONNECTION_CLASS, CHANNEL_CLASS):
            raise LocalProtocolError(f"{method.NAME} is the engine's to send")
        if self.phase in (Phase.CLOSING, Phase.FINISHED):
            return False
        if self.phase is not Phase.OPEN:
            raise LocalProtocolError(f"{method.NAME} before the connection is open")
        return self.is_channel_open(channel)

    def _report_close(self, code: int, text: str, *, by_peer: bool) -> None:
        if not self._reported_close:
            self._reported_close = True
            self._events.append(ConnectionClosed(code, text, by_peer))

    def _drop(self, code: ReplyCode, text: str, *, by_peer: bool) -> None:
        """End without a close frame (socket ended, time-outs, a refused protocol header)."""
        self._report_close(code, text, by_peer=by_peer)
        self._credentials = None
        self.phase = Phase.FINISHED

    def _fail(self, exc: ProtocolError) -> None:
        """The peer broke the protocol beyond one channel: connection.close with the error (RabbitMQ's text
        shape, ``NAME - explanation``); while our close is pending, just end."""
        if self.phase is Phase.CLOSING:
            self.phase = Phase.FINISHED
            return
        self.close(exc.reply_code, f"{exc.reply_code.name} - {exc.text}", exc.class_id, exc.method_id)

    def _read_header(self, data: bytes | bytearray) -> bytes | bytearray:
        """Take the protocol header's octets from ``data``; return what follows it."""
        need = 8 - len(self._header)
        self._header += bytes(data[:need])
        if len(self._header) < 8:
            return b""
        verdict = read_protocol_header(self._header)
        if verdict.kind is not HeaderKind.AMQP_0_9_1:
            # §4.2.2: answer with the header we speak, then close (RabbitMQ's version_negotiation)
            self._write(verdict.reply or PROTOCOL_HEADER)
            self._drop(ReplyCode.CONNECTION_FORCED, f"protocol header {self._header!r} refused", by_peer=False)
            return b""
        self.phase = Phase.STARTING
        mechanisms = " ".join(self.mechanisms).encode()
        self._send(0, ConnectionStart(0, 9, self.server_properties, mechanisms, b"en_US"))
        return data[need:]

    def _on_frame(self, frame: Frame) -> None:
        if isinstance(frame, HeartbeatFrame):
            return
        if self.phase is Phase.CLOSING:
            self._on_frame_while_closing(frame)
        elif frame.channel == 0:
            if not isinstance(frame, MethodFrame):
                raise ProtocolError(ReplyCode.UNEXPECTED_FRAME, "a content frame on channel 0")
            self._on_connection_method(frame.method)
        elif self.phase is not Phase.OPEN:
            raise ProtocolError(
                ReplyCode.UNEXPECTED_FRAME, f"a frame on channel {frame.channel} before the connection is open"
            )
        else:
            try:
                self._on_channel_frame(frame)
            except ProtocolError as exc:
                if exc.hard:
                    raise
                self.close_channel(
                    frame.channel, exc.reply_code, f"{exc.reply_code.name} - {exc.text}", exc.class_id, exc.method_id
                )

    def _on_frame_while_closing(self, frame: Frame) -> None:
        """Spec, connection.close: after sending it, discard everything but close and close-ok."""
        if not isinstance(frame, MethodFrame) or frame.channel != 0:
            return
        if isinstance(frame.method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
            self.phase = Phase.FINISHED
        elif isinstance(frame.method, ConnectionCloseOk):
            self.phase = Phase.FINISHED

    # -- channel 0: the handshake and connection.close ------------------------------------------------------
    def _on_connection_method(self, method: Method) -> None:
        if isinstance(method, ConnectionClose):
            self._send(0, ConnectionCloseOk())
            self._report_close(method.reply_code, method.reply_text, by_peer=True)
            self.phase = Phase.FINISHED
            return
        expected = _EXPECTED.get(self.phase)
        if expected is None or type(method) is not expected:
            raise ProtocolError(
                ReplyCode.COMMAND_INVALID,
                f"{method.NAME} on channel 0 in connection state {self.phase.value}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if isinstance(method, ConnectionStartOk):
            self._on_start_ok(method)
        elif isinstance(method, ConnectionTuneOk):
            self._on_tune_ok(method)
        elif isinstance(method, ConnectionOpen):
            self.vhost = method.virtual_host
            self.phase = Phase.OPENING
            self._events.append(OpenRequested(method.virtual_host))

    def _on_start_ok(self, start_ok: ConnectionStartOk) -> None:
        self.client_properties = start_ok.client_properties
        self.mechanism = start_ok.mechanism
        if start_ok.mechanism not in self.mechanisms:
            raise ProtocolError(
                ReplyCode.COMMAND_INVALID,
                f"unknown authentication mechanism '{start_ok.mechanism}'",
                class_id=start_ok.CLASS_ID,
                method_id=start_ok.METHOD_ID,
            )
        credentials = parse_credentials(start_ok.mechanism, start_ok.response)
        if credentials is None:
            self.close(ReplyCode.ACCESS_REFUSED, refused_login_text(start_ok.mechanism))
            return
        self._credentials = credentials
        self.phase = Phase.LOGIN
        self._events.append(CredentialsReceived(start_ok.mechanism, credentials[0]))

    def _on_tune_ok(self, tune_ok: ConnectionTuneOk) -> None:
        """``rabbit_reader:validate_negotiated_integer_value`` for frame_max (at least ``FRAME_MIN_SIZE``, not
        above ours, 0 only if ours is 0) and channel_max (not above ours; 0 takes ours); heartbeat as asked."""
        self._check_negotiated("frame_max", tune_ok.frame_max, self.frame_max, FRAME_MIN_SIZE)
        channel_max = tune_ok.channel_max or self.channel_max
        self._check_negotiated("channel_max", channel_max, self.channel_max, 1)
        self.frame_max = tune_ok.frame_max
        self.channel_max = channel_max
        self.heartbeat = tune_ok.heartbeat
        self._reader.frame_max = tune_ok.frame_max and tune_ok.frame_max + FRAME_SIZE_FUDGE
        self.phase = Phase.AWAITING_OPEN

    @staticmethod
    def _check_negotiated(field: str, value: int, ours: int, minimum: int) -> None:
        if value != 0 and value < minimum:
            relation, bound = "lower than the minimum", minimum
        elif ours != 0 and (value == 0 or value > ours):
            relation, bound = "higher than the maximum", ours
        else:
            return
        raise ProtocolError(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {field} = {value} is {relation} allowed value ({bound})",
            class_id=ConnectionTune.CLASS_ID,
            method_id=ConnectionTune.METHOD_ID,
        )

    # -- channels ---------------------------------------------------------------------------------------------
    def _on_channel_frame(self, frame: MethodFrame | HeaderFrame | BodyFrame) -> None:
        channel = frame.channel
        state = self._channels.get(channel)
        method = frame.method if isinstance(frame, MethodFrame) else None
        if state is False:
            # our channel.close is pending: only close (answered) and close-ok (frees the number) count
            if isinstance(method, ChannelCloseOk):
                del self._channels[channel]
            elif isinstance(method, ChannelClose):
                self._send(channel, ChannelCloseOk())
            return
        if state is None:
            self._on_closed_channel_frame(channel, method)
            return
        try:
            command = self._assembler.feed(frame)
        except ProtocolError as exc:
            if isinstance(frame, HeaderFrame) and exc.reply_code is ReplyCode.FRAME_ERROR:
                # the only fault a header frame in its place can have: a body over max_message_size
                raise ProtocolError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"message size {frame.body_size} is larger than configured max size "
                    f"{self._assembler.max_body_size}",
                    class_id=exc.class_id,
                    method_id=exc.method_id,
                ) from None
            raise
        if command is None:
            return
        method = command.method
        if method.CLASS_ID == CHANNEL_CLASS:
            self._on_channel_method(channel, method)
        elif method.CLASS_ID == CONNECTION_CLASS:
            raise _misplaced(method, f"{method.NAME} on channel {channel}")
        elif method.CONTENT:
            assert isinstance(command.properties, BasicProperties)
            self._events.append(CommandReceived(channel, method, command.properties, command.body))
        else:
            self._events.append(CommandReceived(channel, method))

    def _on_closed_channel_frame(self, channel: int, method: Method | None) -> None:
        """A frame on a channel not open: channel.open opens it (within channel_max), anything else is 504."""
        if not isinstance(method, ChannelOpen):
            raise ProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"channel {channel} is not open",
                class_id=method.CLASS_ID if method else 0,
                method_id=method.METHOD_ID if method else 0,
            )
        if self.channel_max and channel > self.channel_max:
            raise ProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"channel {channel} is above the negotiated channel_max ({self.channel_max})",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        self._channels[channel] = True
        self._send(channel, ChannelOpenOk())
        self._events.append(ChannelOpened(channel))

    def _on_channel_method(self, channel: int, method: Method) -> None:
        if isinstance(method, ChannelClose):
            del self._channels[channel]
            self._send(channel, ChannelCloseOk())
            self._events.append(ChannelClosed(channel, method.reply_code, method.reply_text, by_peer=True))
        elif isinstance(method, ChannelFlow):
            self._send(channel, ChannelFlowOk(method.active))
            self._events.append(FlowRequested(channel, method.active))
        elif isinstance(method, ChannelOpen):
            # rabbit_channel: "second 'channel.open' seen"
            raise ProtocolError(
                ReplyCode.CHANNEL_ERROR,
                f"second 'channel.open' seen on channel {channel}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        else:  # open-ok, close-ok, flow-ok: answers to what we never sent
            raise _misplaced(method, f"{method.NAME} on channel {channel}, which awaits no answer")


def _misplaced(method: Method, text: str) -> ProtocolError:
    return ProtocolError(ReplyCode.COMMAND_INVALID, text, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


def _server_properties(given: dict[str, Any] | None) -> dict[str, Any]:
    """connection.start's server-properties: ours, with ``given``'s keys (and capabilities) over them."""
    given = dict(given or {})
    capabilities = {**DEFAULT_CAPABILITIES, **given.pop("capabilities", {})}
    return {
        "product": "minibroker",
        "platform": "Python",
        **given,
        "capabilities": capabilities,
    }
