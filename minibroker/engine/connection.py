"""Server end of one AMQP 1.0 connection, sans-IO (Part 2 §2.2-§2.8, Part 5 §5.3).

Theory of operation
-------------------
Bytes go in through ``receive_events(data, now)``, which yields events frame by frame: the next frame is
parsed only once the caller has taken (and acted on) the events of the one before, so the broker core
handles a read exactly as if its frames had come one by one (``receive_data`` gives them as a list, for
callers that give no commands in between). Frames to send are collected in an output buffer that
``data_to_send()`` drains. Time only arrives as ``now``. The engine owns the protocol state: the header
exchange, SASL, open/close, sessions with their windows, links with their credit, delivery ids,
reassembly of multi-frame transfers and splitting of large ones. It decides nothing about messages: that
is the broker core's job, done through the commands at the bottom of the class (``accept_attach``,
``deliver``, ``settle``, ``abort`` ...), each of which only queues frames, and each of which raises
``LocalProtocolError`` when given where it makes no sense. A flow with echo on a link where we send is answered
once its ``LinkFlow`` has been handled (when the next frame is parsed, or the read ends), so the answer tells what
the broker did with the credit and what it has left (``set_available``, §2.7.4).

SASL: the engine decides the outcome itself, unless the policy defers PLAIN checks (``SaslPolicy.deferred``,
for checks too slow to make while the caller waits): then it reports ``CredentialsReceived``, hands the
credentials over once (``take_credentials``) and parses nothing more until the embedder's ``sasl_verdict``;
``resume_events`` then yields the verdict's events and reads on through what the peer sent meanwhile.

Errors: a peer that breaks the protocol raises a ``ProtocolError`` inside the engine; it never escapes
``receive_data``. Its scope picks the answer: close the connection, end the session, or detach the
link, each with the error's condition. A connection-level error is final: after our close frame the
engine ignores input and ``finished`` turns true, so the I/O layer flushes and drops the socket.

Not here on purpose: routing, settlement policy, transactions (broker core); sockets and clocks (server).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from enum import Enum
from operator import attrgetter
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    Transfer,
)
from minibroker.amqp.errors import (
    Condition,
    ConnectionDecodeError,
    ConnectionNotAllowed,
    FramingError,
    HandleInUse,
    LinkError,
    LocalProtocolError,
    MessageSizeExceeded,
    ProtocolError,
    Scope,
    SessionError,
    TransferLimitExceeded,
    UnattachedHandle,
    WindowViolation,
    error,
)
from minibroker.amqp.fastpath import (
    DISPOSITION_PREFIX,
    TRANSFER_PREFIX,
    disposition_fields,
    encode_disposition,
    encode_transfer,
    encode_transfer_all_fields,
    transfer_fields,
)
from minibroker.amqp.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_HEADER,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    encode_frame,
    encode_frame_all_fields,
)
from minibroker.amqp.states import DeliveryState
from minibroker.amqp.types import DecodeError, Symbol, UByte, UInt
from minibroker.engine.endpoints import (
    LOCK_TOKEN_FORMAT,
    RECEIVER,
    SENDER,
    SERIAL_MASK,
    IncomingDelivery,
    Link,
    LinkState,
    OutgoingDelivery,
    Session,
)
from minibroker.engine.events import (
    Authenticated,
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionOpened,
    CredentialsReceived,
    DeliveryUpdated,
    Event,
    IncomingSettled,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
    SessionFlow,
    TransferDiscarded,
    TransferReceived,
)
from minibroker.engine.sasl import PLAIN, SASL_AUTH, SASL_OK, SaslPolicy, deferred_credentials, outcome_for

Trace = Callable[[str, int, Any, int], None]
"""trace(direction "<-" or "->", channel, performative or header bytes, payload length)."""

_INCOMING_WINDOW = 2048  # transfer frames we accept before the peer needs a session flow from us
_PENDING_LIMIT = 64  # outgoing transfer frames held back by the peer's window before we stop sending
_CLOSE_GRACE = 2.0  # seconds we wait for the peer's close after sending ours with an error
_MADE = itertools.count()  # (connections numbered as they are made, across brokers: only their order matters)
# Frames one message may take when max-message-size is set: one per _BYTES_PER_FRAME bytes of the limit (half the
# smallest max-frame-size, 512, so a sender filling frames of any size AMQP allows stays well within), and never
# fewer than _MIN_FRAMES. Endless empty or tiny continuation frames thus end, while bytes are counted exactly.
_BYTES_PER_FRAME = 256
_MIN_FRAMES = 1024


class Phase(Enum):
    """Connection phases, in the order they happen."""

    HEADER = "header"  # waiting for the peer's protocol header
    SASL = "sasl"  # mechanisms sent, waiting for sasl-init
    SASL_CHECKING = "sasl-checking"  # credentials handed to the embedder, waiting for its ``sasl_verdict``
    SASL_DONE = "sasl-done"  # outcome ok sent, waiting for the AMQP header
    OPEN = "open"  # AMQP header exchanged, waiting for open
    OPENED = "opened"
    CLOSE_SENT = "close-sent"  # our close is out, waiting for theirs
    FINISHED = "finished"  # nothing more to read or write but what is buffered


# The phases and link states as module constants: on Python 3.11 looking an enum member up on its class
# (``Phase.OPENED``) costs about ten times a global, and every frame checks the phase several times
_HEADER, _SASL, _SASL_CHECKING, _SASL_DONE = Phase.HEADER, Phase.SASL, Phase.SASL_CHECKING, Phase.SASL_DONE
_OPEN, _OPENED, _CLOSE_SENT, _FINISHED = Phase.OPEN, Phase.OPENED, Phase.CLOSE_SENT, Phase.FINISHED
_ATTACHING, _ATTACHED, _DETACHED = LinkState.ATTACHING, LinkState.ATTACHED, LinkState.DETACHED
_HANDSHAKE_PHASES = (_HEADER, _SASL, _SASL_CHECKING, _SASL_DONE, _OPEN)
_OUTPUT_LIMIT = 1 << 20  # bytes queued for a peer beyond which no more deliveries are started


class ServerConnection:
    """Server end of one AMQP connection (Part 2 §2.4)."""

    def __init__(
        self,
        *,
        container_id: str = "minibroker",
        sasl: SaslPolicy | None = None,
        max_frame_size: int = 65536,
        channel_max: int = 255,
        idle_time_out: float | None = None,
        min_heartbeat_interval: float = 0.5,
        max_message_size: int | None = None,
        offered_capabilities: list[str] | None = None,
        trace: Trace | None = None,
        conn_id: int = 0,
        max_sessions: int = 256,
        max_links: int = 1024,
        handshake_timeout: float | None = None,
        now: float = 0.0,
        refuse: Error | None = None,
        external_identity: str | None = None,
        admit: Callable[[], Error | None] | None = None,
        all_fields: Callable[[Open], bool] | None = None,
    ) -> None:
        self.conn_id = conn_id
        """A number the embedder gives this connection (logs, traces, introspection)."""
        self.made = next(_MADE)
        """Its place among the connections made: the order the broker handles several in (``Broker._handle_caused``)."""
        self.container_id = container_id
        self.sasl = sasl or SaslPolicy()
        self.max_frame_size = max(MIN_MAX_FRAME_SIZE, max_frame_size)
        self.channel_max = channel_max
        self.idle_time_out = idle_time_out
        self.min_heartbeat_interval = min_heartbeat_interval
        """Seconds: heartbeats never go out more often; a peer whose idle-time-out is shorter is refused."""
        self.max_message_size = max_message_size
        self.offered_capabilities = offered_capabilities
        self.trace = trace
        self.max_sessions = max_sessions
        """Sessions open at once; a begin beyond is answered and ended with amqp:resource-limit-exceeded."""
        self.max_links = max_links
        """Links attached at once on one session: our begin announces a handle-max one less, and an attach above it
        closes the connection with framing-error (§2.7.2)."""
        self.handshake_timeout = handshake_timeout
        """Seconds from connect to open; a peer that sends nothing, or stalls in SASL, is dropped."""
        self.refuse = refuse
        """When set, the connection is refused: its open is answered with open and close(refuse)."""
        self.admit = admit
        """Asked once, when the peer's open arrives (unless ``refuse`` is set): an error refuses the connection
        like ``refuse``, None lets it in. The embedder counts open connections with it."""
        self.all_fields = all_fields
        """Asked once, when the peer's open arrives and before ours goes out: True makes every performative we send
        from then on carry all its fields, trailing nulls included (the ``servicebus`` personality: azure-eventhub
        5.x ``_pyamqp/_decode.py`` ``decode_frame`` reads them by position). Chosen once, so other connections
        pay nothing for it."""
        self._encode_frame = encode_frame
        self._encode_transfer = encode_transfer
        self._encode_disposition: Callable[[bool, int, int | None, bool, Any], bytes | None] = encode_disposition
        self.external_identity = external_identity
        """The TLS client certificate's identity, offered as SASL EXTERNAL (Part 5 §5.3.3.1)."""
        self.throttled = False
        """True when a delivery was held back because output is piling up (the peer is not reading)."""
        self.phase = _HEADER
        self.user: str | None = None
        self.remote_open: Open | None = None
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        self.remote_idle_time_out: float | None = None
        self._heartbeat_interval: float | None = None  # how often we must send something, from the peer's open
        self.sessions: dict[int, Session] = {}  # by the peer's channel
        self._local_channels: dict[int, Session] = {}
        self._end_sent: set[int] = set()  # peer channels whose session we ended, awaiting the peer's end
        self._in = bytearray()
        self._pos = 0  # where parsing stands in ``_in`` (consumed bytes are dropped once per read)
        self._partials = 0  # links with a delivery half received
        self.authentication_failed = False
        """SASL failed (the I/O layer delays the answer against password guessing)."""
        self._credentials: tuple[str, str] | None = None  # PLAIN credentials until the embedder takes them
        self._checking_user = ""  # whose credentials await the embedder's verdict
        self._out = bytearray()
        self._events: list[Event] = []
        # links where we are sender whose peer asked for our flow (§2.7.4 echo): answered once its ``LinkFlow``
        # has been handled, so the answer tells what the broker did with the credit (``set_available``)
        self._echoes: list[Link] = []
        self._now = now
        self._started = now
        self._last_received = now
        self._last_sent = now
        self._close_deadline: float | None = None
        self._closed_event_sent = False
        self.context: Any = None
        self.gateway: str | None = None
        """The protocol a gateway in front of this connection speaks to its client ("amqp-0-9-1"), set by the
        embedder; None for an AMQP 1.0 peer."""

    # -- I/O side ---------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """True when the connection is over; flush ``data_to_send`` and close the socket."""
        return self.phase is _FINISHED

    @property
    def closing(self) -> bool:
        """True once the connection is ending (our close sent, or over): links detached now go with it."""
        return self.phase is _CLOSE_SENT or self.phase is _FINISHED

    def data_to_send(self) -> bytes:
        """Take every byte queued for the peer."""
        if not self._out:
            return b""
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
        """Feed bytes from the peer (``b""`` means end of stream); return what happened."""
        return list(self.receive_events(data, now))

    def receive_events(self, data: bytes | bytearray, now: float) -> Iterator[Event]:
        """Feed bytes from the peer (``b""`` means end of stream); yield what happened, frame by frame.

        The next frame is parsed only when the events of the one before have been taken, so a command given
        while handling an event (detaching a link, settling a delivery) is in force for every later frame of
        the same read, exactly as if each frame had been read on its own: a transfer on a link we detached
        meanwhile is dropped (§2.6.2), a disposition for a delivery we settled meanwhile finds nothing.

        The bytes are taken at once; the frames are parsed as the events are taken.
        """
        # a plain function handing back ``_parse``'s generator: every event passes one generator frame, not two
        self._now = now
        self._last_received = now
        if not data:
            if self.phase is not _FINISHED:
                self._finish(None, by_peer=True)
            return iter(self._take_events())
        if self.phase is _FINISHED:
            return iter(())
        self._in += data
        return self._parse()

    def resume_events(self, now: float) -> Iterator[Event]:
        """After ``sasl_verdict``: the events it caused, then those of the input that arrived meanwhile (none is
        parsed while a verdict is awaited)."""
        self._now = now
        yield from self._take_events()
        if self._in and self.phase is not _FINISHED:
            yield from self._parse()

    def _parse(self) -> Iterator[Event]:
        """Parse the buffered input frame by frame, yielding the events of each (see ``receive_events``)."""
        buf = self._in
        max_frame_size = self.max_frame_size
        ahead: list[Event] = []  # plain transfers read ahead of their handling (``accept_attach(read_ahead=)``)
        try:
            while True:
                if self._echoes:  # the events of the frame before have been handled
                    self._answer_echoes()
                try:
                    phase: Phase = self.phase  # (not narrowed: commands run between frames)
                    pos = self._pos
                    if len(buf) - pos < 8 or phase is _FINISHED or phase is _SASL_CHECKING:
                        break
                    if phase is _HEADER or phase is _SASL_DONE:
                        self._pos = pos + 8
                        self._on_header(bytes(buf[pos : pos + 8]))
                    else:
                        size, doff, frame_type, channel = FRAME_HEADER.unpack_from(buf, pos)
                        if size < 8:
                            raise FramingError(f"frame size {size} is below the 8-byte minimum")
                        if size > max_frame_size:
                            raise FramingError(f"frame size {size} exceeds max-frame-size {max_frame_size}")
                        if doff < 2 or doff * 4 > size:
                            raise FramingError(f"data offset {doff} is invalid for a frame of {size} bytes")
                        if len(buf) - pos < size:
                            break
                        start = pos + doff * 4
                        if ahead and buf[start : start + 3] != TRANSFER_PREFIX:
                            # only transfers are read ahead of transfers: anything else (a flow granting credit,
                            # say) waits until they are handled, so none of them sees a frame that came after
                            yield from self._release(ahead)
                            ahead = []
                            continue
                        self._pos = pos + size
                        self._on_frame(frame_type, channel, bytes(buf[start : pos + size]))
                except ProtocolError as exc:
                    # Only connection-scope errors reach here; the others are handled where raised.
                    self._close_with(exc.to_error())
                    if isinstance(exc, FramingError):
                        # the byte stream is out of step: the peer's close could never be parsed, so do not wait
                        buf.clear()
                        self._pos = 0
                        self._finish(None, by_peer=False)
                    # else the frames after the bad one may hold the peer's close (§2.4.3): read them on
                events = self._events
                if not events:
                    continue
                if len(events) == 1:  # the common case: one frame, one event
                    event = events[0]
                    events.clear()
                    if (
                        type(event) is TransferReceived
                        and event.link.read_ahead
                        and event.delivery.earlier_states is None
                        and event.link.credit > 0
                        # the last frame of a read, none read ahead before it: nothing to read ahead of, so no
                        # ``_release`` generator for it (a read of one transfer, issue 19)
                        and (ahead or len(buf) - self._pos >= 8)
                    ):
                        ahead.append(event)  # its handling cannot change how the next frame reads: read on
                        continue
                    if ahead:
                        yield from self._release(ahead)
                        ahead = []
                    yield event
                else:
                    self._events = []
                    if ahead:
                        yield from self._release(ahead)
                        ahead = []
                    yield from events
            if ahead:
                yield from self._release(ahead)
            if self._echoes:
                self._answer_echoes()
        finally:
            del buf[: self._pos]
            self._pos = 0
            self._echoes.clear()  # (left only when the caller stopped taking events: the connection is failing)

    def _release(self, ahead: list[Event]) -> Iterator[Event]:
        """The transfers read ahead, one at a time, unless the connection was closed meanwhile (§2.4.3: after
        our close nothing the peer sent is acted on)."""
        for event in ahead:
            if self.phase is _CLOSE_SENT or self.phase is _FINISHED:
                return
            yield event

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` must next be called, or None."""
        if self.phase is _OPENED and self._close_deadline is None:
            # an open connection (asked once per read: issue 19): its heartbeat and the peer's idle time-out, no list
            heartbeat, idle = self._heartbeat_interval, self.idle_time_out
            if not heartbeat:
                return self._last_received + idle if idle else None
            send_by = self._last_sent + heartbeat
            return min(send_by, self._last_received + idle) if idle else send_by
        deadlines = []
        if self._close_deadline is not None:
            deadlines.append(self._close_deadline)
        if self.handshake_timeout and self.phase in _HANDSHAKE_PHASES:
            deadlines.append(self._started + self.handshake_timeout)
        if self.phase is _OPENED:
            if self._heartbeat_interval:
                deadlines.append(self._last_sent + self._heartbeat_interval)
            if self.idle_time_out:
                deadlines.append(self._last_received + self.idle_time_out)
        return min(deadlines) if deadlines else None

    def handle_timeout(self, now: float) -> list[Event]:
        """Send heartbeats, enforce our idle time-out, give up on a peer that does not close."""
        self._now = now
        if self._close_deadline is not None and now >= self._close_deadline:
            self._close_deadline = None
            self._finish(None, by_peer=False)
        elif (
            self.handshake_timeout and self.phase in _HANDSHAKE_PHASES and now >= self._started + self.handshake_timeout
        ):
            # a peer that connects and sends nothing, or stalls in SASL, is dropped
            self._finish(error(Condition.RESOURCE_LIMIT_EXCEEDED, "handshake timed out"), by_peer=False)
        elif self.phase is _OPENED:
            if self.idle_time_out and now >= self._last_received + self.idle_time_out:
                # §2.4.5: a peer silent past our idle time-out is gone
                self._close_with(error(Condition.RESOURCE_LIMIT_EXCEEDED, "local-idle-timeout expired"))
            elif self._heartbeat_interval and now >= self._last_sent + self._heartbeat_interval:
                self._write(EMPTY_FRAME)
        return self._take_events()

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _write(self, data: bytes) -> None:
        self._out += data
        self._last_sent = self._now

    def _send(self, channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        if self.phase in (_CLOSE_SENT, _FINISHED):
            return  # §2.4.3: nothing follows our close
        frame = self._encode_frame(channel, performative, payload, frame_type)
        if len(frame) > self.remote_max_frame_size:
            # an error's description is ours to word: cut it to fit rather than fail (it may quote what the peer
            # sent: a long address, a long txn-id)
            shorter = _with_short_error(performative, len(frame) - self.remote_max_frame_size)
            if shorter is not None:
                performative = shorter
                frame = self._encode_frame(channel, performative, payload, frame_type)
        if len(frame) > self.remote_max_frame_size and not isinstance(performative, Close):
            # §2.8.15 frame-size-too-small: e.g. an attach echoing a long address to a peer taking 512 bytes
            size = f"a {len(frame)}-byte {type(performative).__name__} frame"
            limit = f"max-frame-size {self.remote_max_frame_size}"
            self._close_with(error(Condition.FRAME_SIZE_TOO_SMALL, f"{size} does not fit the peer's {limit}"))
            return
        if self.trace is not None:
            self.trace("->", channel, performative, len(payload))
        self._write(frame)

    # -- parsing ------------------------------------------------------------------------------------
    def _on_header(self, header: bytes) -> None:
        if self.trace is not None:
            self.trace("<-", 0, header, 0)
        if header == SASL_HEADER and self.phase is _HEADER:
            self._write_header(SASL_HEADER)
            mechanisms: list[str] = [Symbol(m) for m in self.sasl.mechanisms_for(self.external_identity)]
            self._send(0, SaslMechanisms(sasl_server_mechanisms=mechanisms), frame_type=SASL_FRAME)
            self.phase = _SASL
        elif header == AMQP_HEADER and (self.phase is _SASL_DONE or not self.sasl.required):
            self._write_header(AMQP_HEADER)
            self.phase = _OPEN
        else:
            # §2.2: answer an unsupported (or, with SASL required, premature) header with ours, then close
            self._write_header(SASL_HEADER if self.sasl.required and self.phase is _HEADER else AMQP_HEADER)
            self._finish(None, by_peer=False)

    def _write_header(self, header: bytes) -> None:
        if self.trace is not None:
            self.trace("->", 0, header, 0)
        self._write(header)

    def _on_frame(self, frame_type: int, channel: int, body: bytes) -> None:
        if not body:
            if self.trace is not None:
                self.trace("<-", channel, None, 0)
            return  # an empty frame: heartbeat (§2.4.5)
        prefix = body[:3]
        kind: type
        fields: tuple[Any, ...] | None = None
        try:
            # a transfer or a disposition (every frame of the message and transaction paths) is read as a tuple of
            # its fields and its end, and handled so: no performative object per frame (issue 19)
            if prefix == TRANSFER_PREFIX:
                kind, fields = Transfer, transfer_fields(body)
            elif prefix == DISPOSITION_PREFIX:
                kind, fields = Disposition, disposition_fields(body)
            else:
                performative, end = codec.decode(body)
                kind = type(performative)
                if kind is Transfer or kind is Disposition:  # a ulong or symbol descriptor (Part 1 §1.5): as valid
                    fields = (*performative.field_values(), end)
        except DecodeError as exc:
            raise ConnectionDecodeError(f"performative does not decode: {exc}") from None
        handler = _SESSION_HANDLERS.get(kind)
        in_session = handler is not None and self.phase is _OPENED and frame_type == AMQP_FRAME
        if fields is not None and (self.trace is not None or not in_session):
            performative, end = kind(*fields[:-1]), fields[-1]  # only a trace or a frame out of place reads it
        if self.trace is not None:
            self.trace("<-", channel, performative, len(body) - end)
        if not in_session:
            # the handshake, the connection's own performatives, and whatever is out of place; a session's frames on
            # an open connection (every frame of the message and transaction paths) skip these checks in one test
            self._on_connection_frame(frame_type, channel, performative)
            return
        session = self.sessions.get(channel)
        if session is None:
            if channel in self._end_sent:
                # §2.5.2: we ended this session; frames sent before the peer saw our end are dropped,
                # and its end frees the channel
                if kind is End:
                    self._end_sent.discard(channel)
                return
            raise ConnectionNotAllowed(f"frame on channel {channel}, where no session has begun")
        try:
            if kind is Transfer:
                self._on_transfer(session, fields, body)
            elif kind is Disposition:
                self._on_disposition(session, fields)
            elif handler is not None:  # (always: ``in_session``)
                handler(self, session, performative)
        except SessionError as exc:
            self._end_session(session, exc.to_error())
        except LinkError as exc:
            link = session.links.get(exc.handle)
            if link is not None and link.state is _ATTACHING:
                # the broker has not answered its attach yet (e.g. attach and transfer in one read): the peer
                # must see our attach before our detach (§2.6.3), so refuse the link, and take back the event
                # that asked the broker to answer it
                self._events = [e for e in self._events if not (isinstance(e, LinkAttached) and e.link is link)]
                self.refuse_attach(link, exc.to_error())
            elif link is not None:
                self._detach_link(link, exc.to_error())

    def _on_connection_frame(self, frame_type: int, channel: int, performative: Any) -> None:
        """A frame that is not a session's on an open connection: SASL, open, close, begin, or out of place."""
        if self.phase is _SASL:
            if frame_type != SASL_FRAME or not isinstance(performative, SaslInit):
                raise ConnectionNotAllowed(f"expected sasl-init, got {type(performative).__name__}")
            self._on_sasl_init(performative)
            return
        if frame_type != AMQP_FRAME:
            raise FramingError(f"frame type {frame_type} is not an AMQP frame")
        if self.phase is _CLOSE_SENT:
            if isinstance(performative, Close):
                self._finish(None, by_peer=True)
            return  # §2.4.3: after close is sent, everything but close is ignored
        if type(performative) not in _PERFORMATIVES:
            raise ConnectionNotAllowed(f"{type(performative).__name__} is not a performative")
        if self.phase is _OPEN and not isinstance(performative, Open):
            raise ConnectionNotAllowed("the first frame must be open")
        if self.phase is _OPENED and isinstance(performative, Open):
            raise ConnectionNotAllowed("open received twice")
        if isinstance(performative, Open):
            if channel != 0:
                raise ConnectionNotAllowed("open must be sent on channel 0")
            self._on_open(performative)
        elif isinstance(performative, Close):
            self._on_close(performative)
        elif isinstance(performative, Begin):
            self._on_begin(channel, performative)
        else:  # (a session's frame: only once open, and then ``_on_frame`` took it)
            raise ConnectionNotAllowed(f"{type(performative).__name__} before the connection is open")

    # -- SASL -----------------------------------------------------------------------------------------
    def _on_sasl_init(self, init: SaslInit) -> None:
        credentials = deferred_credentials(self.sasl, init, self.external_identity)
        if credentials is not None:
            # the embedder checks them (slowly, elsewhere): nothing more is parsed until its verdict
            self._credentials = credentials
            self._checking_user = credentials[0]
            self.phase = _SASL_CHECKING
            self._events.append(CredentialsReceived(str(init.mechanism), credentials[0]))
            return
        code, user = outcome_for(self.sasl, init, self.external_identity)
        self._sasl_outcome(str(init.mechanism), code, user)

    def _sasl_outcome(self, mechanism: str, code: int, user: str | None) -> None:
        self._send(0, SaslOutcome(code=code), frame_type=SASL_FRAME)
        if code == SASL_OK:
            self.user = user
            self.phase = _SASL_DONE
            self._events.append(Authenticated(mechanism, user))
        else:
            assert code == SASL_AUTH
            self.authentication_failed = True
            self._events.append(AuthenticationFailed(mechanism))
            self._finish(None, by_peer=False)

    @property
    def awaiting_verdict(self) -> bool:
        """True while PLAIN credentials wait for ``sasl_verdict`` (see ``SaslPolicy.deferred``)."""
        return self.phase is _SASL_CHECKING

    def take_credentials(self) -> tuple[str, str]:
        """The user and password to check, once; answer with ``sasl_verdict``."""
        if self._credentials is None:
            raise LocalProtocolError("no credentials are waiting to be checked")
        credentials, self._credentials = self._credentials, None
        return credentials

    def sasl_verdict(self, ok: bool) -> None:
        """Answer the credentials taken with ``take_credentials``: sasl-outcome ok, or auth and the end of the
        connection. Then ``resume_events`` parses what the peer sent meanwhile. Ignored once the connection is
        over (it may time out or be dropped while its password is checked)."""
        if self.phase is _FINISHED:
            return
        if self.phase is not _SASL_CHECKING:
            raise LocalProtocolError(f"no SASL verdict is awaited in phase {self.phase.value}")
        self._credentials = None
        self._sasl_outcome(PLAIN, SASL_OK if ok else SASL_AUTH, self._checking_user if ok else None)

    # -- connection ---------------------------------------------------------------------------------
    def _on_open(self, open_: Open) -> None:
        self.remote_open = open_
        self.remote_max_frame_size = max(
            MIN_MAX_FRAME_SIZE, 0xFFFFFFFF if open_.max_frame_size is None else open_.max_frame_size
        )
        if open_.channel_max is not None:
            self.channel_max = min(self.channel_max, open_.channel_max)
        refusal = self.refuse
        if open_.idle_time_out:
            self.remote_idle_time_out = open_.idle_time_out / 1000
            # §2.4.5: heartbeats at half the peer's idle-time-out, but never more often than our floor; a peer that
            # needs them more often than that is refused ("If a peer can not, for any reason support a proposed idle
            # timeout, then it SHOULD close the connection using a close frame with an error explaining why")
            self._heartbeat_interval = max(self.remote_idle_time_out / 2, self.min_heartbeat_interval)
            if self.remote_idle_time_out < self.min_heartbeat_interval and refusal is None:
                floor = f"{self.min_heartbeat_interval * 1000:g} ms"
                refusal = error(
                    Condition.RESOURCE_LIMIT_EXCEEDED,
                    f"idle-time-out of {int(open_.idle_time_out)} ms is below the broker's minimum of {floor}",
                )
        if self.all_fields is not None and self.all_fields(open_):
            self._encode_frame = encode_frame_all_fields
            self._encode_transfer = encode_transfer_all_fields
            self._encode_disposition = _no_fast_encoding
        self._send(
            0,
            Open(
                container_id=self.container_id,
                max_frame_size=UInt(self.max_frame_size),
                channel_max=self.channel_max,
                idle_time_out=int(self.idle_time_out * 1000) if self.idle_time_out else None,
                offered_capabilities=(
                    [Symbol(c) for c in self.offered_capabilities] if self.offered_capabilities else None
                ),
            ),
        )
        self.phase = _OPENED
        if refusal is None and self.admit is not None:
            refusal = self.admit()
        if refusal is not None:
            # e.g. too many connections: a clear AMQP error rather than a dropped socket
            self._close_with(refusal)
            return
        self._events.append(ConnectionOpened(open_))

    def _on_close(self, close: Close) -> None:
        self._send(0, Close())
        self._finish(close.error, by_peer=True)

    def _close_with(self, err: Error) -> None:
        """Send close with ``err``; wait briefly for the peer's close, then finish."""
        if self.phase in (_FINISHED, _CLOSE_SENT):
            return
        if self.phase in (_OPEN, _OPENED):
            if self.phase is _OPEN:
                # §2.4.1: a close must follow an open, so answer the open we never saw with ours first
                self._send(0, Open(container_id=self.container_id))
            self._send(0, Close(error=err))
            self._detach_everything(err)
            self.phase = _CLOSE_SENT
            self._close_deadline = self._now + _CLOSE_GRACE
            self._events.append(ConnectionClosed(err, by_peer=False))
            self._closed_event_sent = True
        else:
            self._finish(err, by_peer=False)

    def _finish(self, err: Error | None, *, by_peer: bool) -> None:
        if self.phase is _FINISHED:
            return
        self._detach_everything(err)
        self.phase = _FINISHED
        self._in.clear()  # input after the end is never read: do not hold on to it
        self._pos = 0
        self._close_deadline = None
        if not self._closed_event_sent:
            self._closed_event_sent = True
            self._events.append(ConnectionClosed(err, by_peer=by_peer))

    def _detach_everything(self, err: Error | None) -> None:
        for session in list(self.sessions.values()):
            self._drop_session(session, err)

    # -- sessions -----------------------------------------------------------------------------------
    def _on_begin(self, channel: int, begin: Begin) -> None:
        if begin.remote_channel is not None:
            raise ConnectionNotAllowed("a server does not begin sessions, so remote-channel must be null")
        if channel in self.sessions:
            raise ConnectionNotAllowed(f"channel {channel} already has a session")
        if channel > self.channel_max:
            raise ConnectionNotAllowed(f"channel {channel} exceeds channel-max {self.channel_max}")
        local = next(c for c in range(self.channel_max + 2) if c not in self._local_channels)
        if local > self.channel_max:
            raise ConnectionNotAllowed("no free channel")
        refused = len(self.sessions) >= self.max_sessions
        session = Session(local, channel, begin.next_outgoing_id or 0, _INCOMING_WINDOW)
        session.remote_incoming_window = begin.incoming_window or 0
        # the peer may attach no more links than our handles can name (its handle-max): so ours stay in its range
        session.handle_max = min(self.max_links - 1, 0xFFFFFFFF if begin.handle_max is None else begin.handle_max)
        self.sessions[channel] = session
        self._local_channels[local] = session
        self._send(
            local,
            Begin(
                remote_channel=channel,
                next_outgoing_id=UInt(0),
                incoming_window=UInt(_INCOMING_WINDOW),
                outgoing_window=UInt(0xFFFFFFFF),
                handle_max=UInt(session.handle_max),
            ),
        )
        if refused:
            # a session beyond the limit is begun and at once ended with the reason
            limit = f"at most {self.max_sessions} sessions per connection"
            self._end_session(session, error(Condition.RESOURCE_LIMIT_EXCEEDED, limit))
            return
        self._events.append(SessionBegun(session))

    def _on_end(self, session: Session, end: End) -> None:
        self._drop_session(session, end.error)
        self._send(session.channel, End())

    def _end_session(self, session: Session, err: Error) -> None:
        self._send(session.channel, End(error=err))
        self._drop_session(session, err)
        self._end_sent.add(session.remote_channel)

    def _drop_session(self, session: Session, err: Error | None) -> None:
        session.ended = True
        for link in list(session.links.values()):
            # a session end or connection close detaches its links without closing them: a durable terminus
            # outlives it (Part 3 §3.5.6, expiry-policies session-end and connection-close)
            self._drop_link(link, closed=False, err=err)
        # the session is gone: nothing can be settled on it any more, nor sent
        for outgoing in session.outgoing_unsettled.values():
            outgoing.settled = True
        for incoming in session.incoming_unsettled.values():
            incoming.settled = True
        session.outgoing_unsettled.clear()
        session.incoming_unsettled.clear()
        for held, _ in session.pending:
            held.unsent = 0
        session.pending.clear()
        self.sessions.pop(session.remote_channel, None)
        self._local_channels.pop(session.channel, None)
        self._events.append(SessionEnded(session, err))

    # -- links --------------------------------------------------------------------------------------
    @staticmethod
    def _check_handle(session: Session, handle: int | None, performative: str) -> None:
        """§2.7.2 begin, handle-max: "A peer that receives a handle outside the supported range MUST close the
        connection with the framing-error error-code" - whatever frame names it (attach, flow, transfer, detach).
        On attach this is also what bounds the links of a session (max_links)."""
        if handle is not None and handle > session.handle_max:
            raise FramingError(
                f"{performative} with handle {handle}, above the session's handle-max {session.handle_max}"
            )

    def _on_attach(self, session: Session, attach: Attach) -> None:
        handle = int(attach.handle or 0)
        self._check_handle(session, handle, "attach")
        if handle in session.links or handle in session.detach_sent:
            # §2.7.3: a handle stays in use until both ends have sent their detach; ours is out, the peer's is not
            raise HandleInUse(f"handle {handle} is already attached")
        output = next(h for h in range(len(session.links_by_output) + 1) if h not in session.links_by_output)
        link = Link(session, attach, output)
        session.links[link.input_handle] = link
        session.links_by_output[output] = link
        self._events.append(LinkAttached(link))

    def _on_detach(self, session: Session, detach: Detach) -> None:
        self._check_handle(session, detach.handle, "detach")
        link = session.links.get(detach.handle or 0)
        if link is None:
            if detach.handle in session.detach_sent:
                # §2.6.2: the peer's answer to our detach; the handle is free again
                session.detach_sent.discard(detach.handle)
                return
            raise UnattachedHandle(f"detach of handle {detach.handle}, which is not attached")
        closed = bool(detach.closed)
        if link.state is _ATTACHING:
            # attached and detached before the broker answered (events taken all at once): §2.6.3 wants our
            # attach before our detach, and the broker is not to answer it any more
            self._events = [e for e in self._events if not (isinstance(e, LinkAttached) and e.link is link)]
            self._send_null_attach(link)
        if link.state is not _DETACHED:
            self._send(session.channel, Detach(handle=UInt(link.output_handle), closed=closed or None))
        self._drop_link(link, closed=closed, err=detach.error)

    def _drop_link(self, link: Link, *, closed: bool, err: Error | None) -> None:
        session = link.session
        if session.links.get(link.input_handle) is link:
            del session.links[link.input_handle]
        if session.links_by_output.get(link.output_handle) is link:
            del session.links_by_output[link.output_handle]
        link.state = _DETACHED
        link.credit = 0
        if link.partial_delivery is not None:  # half received: it will never be whole
            self._events.append(TransferDiscarded(link, _states(link.partial_delivery)))
        self._drop_partial(link)
        if not session.ended:
            self._forget_deliveries(link)
        self._events.append(LinkDetached(link, closed, err))

    def _forget_deliveries(self, link: Link) -> None:
        """What we sent on a detached link can no longer be settled, and its held-back frames must never
        follow our detach (the peer would see a transfer on an unattached handle)."""
        session = link.session
        if any(delivery.link is link for delivery, _ in session.pending):
            kept: deque[tuple[OutgoingDelivery, bytes]] = deque()
            for delivery, frame in session.pending:
                if delivery.link is link:
                    delivery.unsent -= 1
                else:
                    kept.append((delivery, frame))
            session.pending = kept
        for gone in [d for d in session.outgoing_unsettled.values() if d.link is link]:
            del session.outgoing_unsettled[gone.delivery_id]
            gone.settled = True
        # the peer's own deliveries on it keep their place: what the broker took is still answered

    def _detach_link(self, link: Link, err: Error | None) -> None:
        self._send(link.session.channel, Detach(handle=UInt(link.output_handle), closed=True, error=err))
        self._drop_link(link, closed=True, err=err)
        link.session.detach_sent.add(link.input_handle)

    def _link(self, session: Session, handle: int | None) -> Link:
        link = session.links.get(handle) if handle is not None else None
        if link is None:
            # §2.8.17 unattached-handle
            raise UnattachedHandle(f"handle {handle} is not attached")
        return link

    # -- flow ---------------------------------------------------------------------------------------
    def _on_flow(self, session: Session, flow: Flow) -> None:
        self._check_handle(session, flow.handle, "flow")
        # §2.5.6: remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id
        next_incoming = session.next_outgoing_id if flow.next_incoming_id is None else flow.next_incoming_id
        window = (next_incoming + (flow.incoming_window or 0) - session.next_outgoing_id) & SERIAL_MASK
        # serial arithmetic: a flow that was overtaken by our transfers can make the window negative, which is 0
        session.remote_incoming_window = 0 if window > 0x7FFFFFFF else window
        self._pump(session)
        if flow.handle is None:
            if flow.echo:
                self._send_session_flow(session)
            self._events.append(SessionFlow(session))
            return
        if flow.handle in session.detach_sent:
            return  # §2.6.2: sent before the peer saw our detach
        link = self._link(session, flow.handle)
        if link.role == SENDER:
            # §2.6.7: link-credit(snd) = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
            rcv_count = link.delivery_count if flow.delivery_count is None else flow.delivery_count
            link.credit = max(0, (rcv_count + (flow.link_credit or 0) - link.delivery_count) & SERIAL_MASK)
            if link.credit > 0x7FFFFFFF:  # a delivery-count "behind" ours: the peer granted nothing new
                link.credit = 0
            link.drain = bool(flow.drain)
        if flow.echo:
            if link.role == SENDER:
                self._echoes.append(link)  # answered once the broker has acted on this flow (``_parse``)
            else:
                self._send_link_flow(link)
        self._events.append(LinkFlow(link, flow.properties))

    def _flow_fields(self, session: Session) -> dict[str, Any]:
        return {
            "next_incoming_id": UInt(session.next_incoming_id),
            "incoming_window": UInt(session.incoming_window),
            "next_outgoing_id": UInt(session.next_outgoing_id),
            "outgoing_window": UInt(0xFFFFFFFF),
        }

    def _send_session_flow(self, session: Session) -> None:
        self._send(session.channel, Flow(**self._flow_fields(session)))

    def _answer_echoes(self) -> None:
        """Send our flow on each link whose peer asked for it with echo (§2.7.4) and got none since."""
        echoes, self._echoes = self._echoes, []
        for link in dict.fromkeys(echoes):
            if link.state is not _DETACHED:
                self._send_link_flow(link)

    def _send_link_flow(self, link: Link, *, drain: bool | None = None) -> None:
        if self._echoes and link in self._echoes:  # this flow answers the echo too
            self._echoes = [other for other in self._echoes if other is not link]
        session = link.session
        # §2.6.7: delivery-count counts the deliveries sent; ours held back by the peer's session window (§2.5.6)
        # are not sent yet: they are reported as credit still to use, so this flow never overtakes them
        # (only a link where we send has deliveries there: a receiver link's flow, a credit top-up, skips the scan)
        held = (
            len({id(d) for d, _ in session.pending if d.link is link and not d.begun})
            if session.pending and link.role == SENDER
            else 0
        )
        self._send(
            session.channel,
            Flow(
                **self._flow_fields(session),
                handle=UInt(link.output_handle),
                delivery_count=UInt((link.delivery_count - held) & SERIAL_MASK),
                link_credit=UInt(link.credit + held),
                available=UInt(link.available) if link.role == SENDER else None,
                drain=drain if drain is not None else (link.drain or None),
            ),
        )

    # -- transfers in -------------------------------------------------------------------------------
    def _on_transfer(self, session: Session, fields: Any, body: bytes) -> None:
        """A transfer frame: ``fields`` as ``transfer_fields`` reads them from ``body``."""
        handle, delivery_id, tag, message_format, settled, more, _, state, _, aborted, _, end = fields
        assert handle is not None  # mandatory: a transfer without one does not decode
        if handle > session.handle_max:  # the cheap test first: the check words the error
            self._check_handle(session, handle, "transfer")
        link = session.links.get(handle)
        # §2.6.2: a transfer sent before the peer saw our detach is counted by the session, then dropped (a handle
        # we detached is not attached again before the peer's detach frees it: ``_on_attach``)
        if link is None and handle not in session.detach_sent:
            self._link(session, handle)  # raises unattached-handle
        if session.incoming_window <= 0:
            # §2.5.6: a transfer beyond the incoming window
            raise WindowViolation("transfer received with the session's incoming window closed")
        session.incoming_window -= 1
        session.next_incoming_id = (session.next_incoming_id + 1) & SERIAL_MASK
        if session.incoming_window < _INCOMING_WINDOW // 2:
            session.incoming_window = _INCOMING_WINDOW
            self._send_session_flow(session)
        if link is None:
            if state is not None:
                self._events.append(TransferDiscarded(None, [state]))
            return
        if link.role != RECEIVER:
            raise ConnectionNotAllowed("transfer on a link where the peer is the receiver")
        delivery = link.partial_delivery
        if delivery is None:
            if link.credit <= 0:
                if state is not None:
                    self._events.append(TransferDiscarded(link, [state]))
                raise TransferLimitExceeded("transfer without link credit", handle=link.input_handle)
            if delivery_id is None:
                raise ConnectionNotAllowed("the first transfer of a delivery must carry a delivery-id")
            link.credit -= 1
            link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
            settled = bool(settled) or link.snd_settle_mode == 1
            delivery = IncomingDelivery(link, delivery_id, tag or b"", settled, state)
        else:
            if settled:
                delivery.settled = True
            if state is not None:
                if delivery.state is not None and state != delivery.state:
                    _remember_state(delivery, delivery.state)
                delivery.state = state
        if aborted:
            # §2.6.14: an aborted delivery is discarded; it needs no settlement (the broker may top up credit)
            self._drop_partial(link)
            self._events.append(TransferDiscarded(link, _states(delivery), aborted=True))
            return
        whole: bytes | bytearray
        partial = link.partial
        payload = body[end:]
        if partial is None:
            # the first frame: a message in one frame is passed on as it came (the common case)
            whole = payload
            if more:
                # reassembled in one buffer: tiny frames cost their bytes, not an object each
                whole = link.partial = bytearray(payload)
                link.partial_frames = 1
        else:
            partial += payload
            link.partial_frames += 1
            whole = partial
        limit = link.max_message_size
        if limit:
            # §2.7.3 attach, max-message-size: "Any attempt to deliver a message larger than this results in a
            # message-size-exceeded link-error"; the frame bound is ours, answered the same way
            # (the frame bound is worked out only past _MIN_FRAMES frames: a one-frame message skips it, issue 19)
            taken = link.partial_frames
            if len(whole) > limit or (taken > _MIN_FRAMES and taken > limit // _BYTES_PER_FRAME):
                frame_limit = max(_MIN_FRAMES, limit // _BYTES_PER_FRAME)
                reason = (
                    f"message of more than {limit} bytes exceeds max-message-size"
                    if len(whole) > limit
                    else f"message in more than {frame_limit} frames (max-message-size {limit} allows at most "
                    f"one frame per {_BYTES_PER_FRAME} bytes, and at least {_MIN_FRAMES})"
                )
                self._drop_partial(link)
                self._events.append(TransferDiscarded(link, _states(delivery)))
                raise MessageSizeExceeded(reason, handle=link.input_handle)
        if more:
            if link.partial_delivery is None:
                link.partial_delivery = delivery
                self._partials += 1
            return
        if partial is not None:
            self._drop_partial(link)
            payload = bytes(partial)
        if not delivery.settled:
            session.incoming_unsettled[delivery.delivery_id] = delivery
        self._events.append(TransferReceived(link, delivery, payload, message_format or 0))

    def _drop_partial(self, link: Link) -> None:
        """The delivery being reassembled on ``link`` is over (whole, aborted, or discarded)."""
        if link.partial_delivery is not None:
            self._partials -= 1
        link.partial = None
        link.partial_frames = 0
        link.partial_delivery = None

    # -- dispositions in ----------------------------------------------------------------------------
    def _on_disposition(self, session: Session, fields: Any) -> None:
        """A disposition frame: ``fields`` as ``disposition_fields`` reads them."""
        role, first, last, settled, state, _, _ = fields
        first = first or 0
        settled = bool(settled)
        table: dict[int, Any] = session.outgoing_unsettled if role == RECEIVER else session.incoming_unsettled
        if last is None or last == first:
            # one delivery (proton's tx_recv accepts each apart): one lookup, no range to walk (issue 19)
            delivery = table.pop(first, None) if settled else table.get(first)
            found = [] if delivery is None else [delivery]
        else:
            found = _take_range(table, first, last, settled)
        if role == RECEIVER:
            out: list[OutgoingDelivery] = found
            for delivery in out:
                delivery.remote_state = state
                delivery.remote_settled = settled
            if out:
                self._events.append(DeliveryUpdated(out, state, settled))
        else:
            inc: list[IncomingDelivery] = found
            for delivery in inc:
                delivery.settled = settled
            if inc:
                self._events.append(IncomingSettled(inc, state))

    # -- commands from the broker core ----------------------------------------------------------------
    def accept_attach(
        self,
        link: Link,
        *,
        source: Any = None,
        target: Any = None,
        max_message_size: int | None = None,
        properties: dict[Any, Any] | None = None,
        offered_capabilities: list[str] | None = None,
        context: Any = None,
        read_ahead: bool = False,
        rcv_settle_mode: int | None = None,
        settle_at_once: bool = False,
        lock_tokens: bool = False,
    ) -> None:
        """Answer the peer's attach with ours, naming the terminus we really provide (§2.6.3).

        ``lock_tokens``: our transfers on the link carry 16-octet delivery-tags (Service Bus clients read them as
        GUID lock tokens: azure-servicebus ``_common/message.py`` ``ServiceBusReceivedMessage.lock_token``).

        ``rcv_settle_mode``: the mode we answer with and follow (§2.8.3; default: the one the peer asked for).
        ``settle_at_once``: answer with the peer's mode, but settle every outcome we give at once (a broker
        personality that behaves so).

        ``context`` is the caller's own object for the link, read back from ``link.context``. ``read_ahead``
        promises that handling a transfer on this link whose frames carried at most one delivery state gives
        no command that changes how a later frame is read (no detach, end or close; credit may be granted):
        ``receive_events`` may then parse on past such transfers before they are handled, as long as the link
        has credit left, and the events come in bulk (in order still).
        """
        if link.state is not _ATTACHING:
            raise LocalProtocolError(f"{link!r} is {link.state.value}: only an attach not yet answered can be accepted")
        link.state = _ATTACHED
        link.context = context
        link.read_ahead = read_ahead
        if lock_tokens:
            link.tag_format = LOCK_TOKEN_FORMAT
        link.source = source
        link.target = target
        link.max_message_size = max_message_size or self.max_message_size
        answered = link.attach.rcv_settle_mode if rcv_settle_mode is None else UByte(rcv_settle_mode)
        if rcv_settle_mode is not None:
            link.rcv_settle_mode = rcv_settle_mode
        if settle_at_once:
            link.rcv_settle_mode = 0
        self._send(
            link.session.channel,
            Attach(
                name=link.name,
                handle=UInt(link.output_handle),
                role=link.role,
                snd_settle_mode=link.attach.snd_settle_mode,
                rcv_settle_mode=answered,
                source=source,
                target=target,
                initial_delivery_count=UInt(link.delivery_count) if link.role == SENDER else None,
                max_message_size=link.max_message_size,
                offered_capabilities=[Symbol(c) for c in offered_capabilities] if offered_capabilities else None,
                properties=properties,
            ),
        )

    def refuse_attach(self, link: Link, err: Error) -> None:
        """Refuse an attach: answer with a null terminus, then detach with ``err`` (§2.6.3)."""
        if link.state is not _ATTACHING:
            raise LocalProtocolError(f"{link!r} is {link.state.value}: only an attach not yet answered can be refused")
        self._send_null_attach(link)
        self._detach_link(link, err)

    def _send_null_attach(self, link: Link) -> None:
        """Our attach for a link we do not take: the terminus on our side is null (§2.6.3)."""
        self._send(
            link.session.channel,
            Attach(
                name=link.name,
                handle=UInt(link.output_handle),
                role=link.role,
                source=link.source if link.role == RECEIVER else None,
                target=link.target if link.role == SENDER else None,
                initial_delivery_count=UInt(0) if link.role == SENDER else None,
            ),
        )

    def detach(self, link: Link, err: Error | None = None) -> None:
        """Close a link from our side (a link already detached stays so: not a misuse, as either end may
        detach first)."""
        if link.state is not _DETACHED:
            self._detach_link(link, err)

    def close(self, err: Error | None = None) -> None:
        """Close the connection from our side (e.g. broker shutdown). Past the protocol headers and before the
        peer's open, our open goes first (``_close_with``): the peer learns why, its socket is not just cut."""
        if self.phase is _OPENED or self.phase is _OPEN:
            self._close_with(err or error(Condition.CONNECTION_FORCED, "broker shutting down"))
        else:
            self._finish(err, by_peer=False)

    def drop(self) -> None:
        """Cut the connection with no close frame (fault injection's ``drop``): what is queued for the peer is
        discarded and nothing more is sent; the links detach and ``ConnectionClosed`` follows, as when the peer's
        socket goes. ``finished`` turns true, so the I/O layer closes the socket."""
        self._out.clear()
        self._finish(error(Condition.CONNECTION_FORCED, "connection dropped (fault injection)"), by_peer=False)
        self._out.clear()

    def take_events(self) -> list[Event]:
        """Events produced by commands (for example a detach after a refused attach)."""
        events, self._events = self._events, []
        return events

    def take_throttled(self) -> bool:
        """Whether a delivery was held back since the last call (see ``can_send``); clears the mark."""
        throttled, self.throttled = self.throttled, False
        return throttled

    @property
    def has_incomplete_transfers(self) -> bool:
        """Whether the peer is in the middle of sending some delivery in several frames."""
        return self._partials > 0

    def incomplete_transfers(self) -> list[IncomingDelivery]:
        """Deliveries the peer has begun to send in several frames and not finished (§2.6.14)."""
        return [
            link.partial_delivery
            for session in self.sessions.values()
            for link in session.links.values()
            if link.partial_delivery is not None
        ]

    @property
    def session_count(self) -> int:
        return len(self.sessions)

    @property
    def link_count(self) -> int:
        return sum(len(session.links) for session in self.sessions.values())

    def grant_credit(self, link: Link, credit: int) -> None:
        """Set the credit of a link where we are receiver and tell the peer (§2.6.7)."""
        if link.state is _DETACHED:
            return
        link.credit = credit
        self._send_link_flow(link)

    def can_send(self, link: Link) -> bool:
        """True when a delivery may be sent on ``link`` now: credit, and no backlog for the peer.

        A backlog is transfers held back by the peer's session window, or output the peer has not read
        yet; then ``throttled`` is set, and the I/O layer calls the broker again once it has written.
        """
        if link.credit <= 0 or link.state is not _ATTACHED:
            return False
        if len(link.session.pending) >= _PENDING_LIMIT or len(self._out) >= _OUTPUT_LIMIT:
            self.throttled = True
            return False
        return True

    def deliver(
        self,
        link: Link,
        payload: bytes,
        *,
        settled: bool,
        state: DeliveryState | None = None,
        context: Any = None,
        message_format: int = 0,
    ) -> OutgoingDelivery:
        """Send one message on ``link`` (our role: sender), split into frames that fit (§2.7.5)."""
        if link.state is not _ATTACHED or link.role != SENDER or link.credit <= 0:
            raise LocalProtocolError(f"cannot deliver on {link!r} ({link.state.value}, credit {link.credit})")
        session = link.session
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & SERIAL_MASK
        link.tag_counter += 1
        tag = link.tag_format.pack(link.tag_counter)
        link.credit -= 1
        link.delivery_count = (link.delivery_count + 1) & SERIAL_MASK
        delivery = OutgoingDelivery(link, delivery_id, tag, settled, context)
        if not settled:
            session.outgoing_unsettled[delivery_id] = delivery
        handle = link.output_handle
        channel = session.channel
        encode_transfer = self._encode_transfer
        performative = encode_transfer(handle, delivery_id, tag, message_format, settled, False, state)
        size = 8 + len(performative) + len(payload)
        if size <= self.remote_max_frame_size:  # the common case: one frame
            frame = FRAME_HEADER.pack(size, 2, AMQP_FRAME, channel) + performative + payload
            self._queue_transfer(delivery, frame, performative, len(payload))
            return delivery
        # §2.6.14: split into frames of at most the peer's max-frame-size, more=true on all but the last
        offset = 0
        first = True
        while offset < len(payload):
            if first:
                head = encode_transfer(handle, delivery_id, tag, message_format, settled, True, state)
            else:
                head = encode_transfer(handle, None, None, None, None, True)
            chunk = payload[offset : offset + self.remote_max_frame_size - 8 - len(head)]
            offset += len(chunk)
            if offset >= len(payload):  # the last frame: more=false
                if first:
                    head = encode_transfer(handle, delivery_id, tag, message_format, settled, False, state)
                else:
                    head = encode_transfer(handle, None, None, None, None, False)
            frame = FRAME_HEADER.pack(8 + len(head) + len(chunk), 2, AMQP_FRAME, channel) + head + chunk
            self._queue_transfer(delivery, frame, head, len(chunk))
            first = False
        return delivery

    def _queue_transfer(self, delivery: OutgoingDelivery, frame: bytes, performative: bytes, size: int) -> None:
        session = delivery.link.session
        if self.trace is not None:
            self.trace("->", session.channel, codec.decode(performative)[0], size)
        if not session.pending and session.remote_incoming_window > 0:
            self._write(frame)  # the window is open and nothing waits: straight out
            delivery.begun = True
            session.remote_incoming_window -= 1
            session.next_outgoing_id = (session.next_outgoing_id + 1) & SERIAL_MASK
            return
        session.pending.append((delivery, frame))
        delivery.unsent += 1
        self._pump(session)

    def _pump(self, session: Session) -> None:
        """Move held-back transfer frames out as far as the peer's incoming window allows (§2.5.6)."""
        pending = session.pending
        while pending and session.remote_incoming_window > 0:
            delivery, frame = pending.popleft()
            delivery.unsent -= 1
            delivery.begun = True
            self._write(frame)
            session.remote_incoming_window -= 1
            session.next_outgoing_id = (session.next_outgoing_id + 1) & SERIAL_MASK

    def settle(self, deliveries: list[OutgoingDelivery], state: DeliveryState | None = None) -> None:
        """Settle deliveries we sent, with ``state`` (disposition, role=sender). A delivery not completely sent
        keeps going out (``abort`` stops one). Settling a delivery that either end has already settled is a
        ``LocalProtocolError``: the peer has forgotten it."""
        for delivery in deliveries:
            if not delivery.open:
                who = "we" if delivery.settled else "the peer"
                raise LocalProtocolError(f"{delivery!r} cannot be settled: {who} settled it already")
        self._dispose(deliveries, SENDER, state)

    def update(self, deliveries: list[OutgoingDelivery], state: DeliveryState) -> None:
        """Tell the peer the state of deliveries we sent, leaving them unsettled (disposition, role=sender,
        settled=false, §2.7.6). Updating a delivery that either end has settled is a ``LocalProtocolError``."""
        for delivery in deliveries:
            if not delivery.open:
                raise LocalProtocolError(f"{delivery!r} cannot be updated: it is settled")
        self._dispose(deliveries, SENDER, state, settled=False)

    def abort(self, delivery: OutgoingDelivery) -> None:
        """Abort a delivery not completely sent (§2.6.14), settled or not: its frames held back by the peer's
        window are replaced by one transfer with aborted=true, which settles it (no disposition follows), so the
        peer never receives the whole message. Aborting a delivery whose every frame is out is a
        ``LocalProtocolError``."""
        if delivery.complete:
            raise LocalProtocolError(f"{delivery!r} is completely sent: too late to abort it")
        link = delivery.link
        session = link.session
        if delivery.begun:
            fields: dict[str, Any] = {}
        else:  # not one frame out yet: the aborted transfer is the delivery's first, so it names it
            fields = {"delivery_id": UInt(delivery.delivery_id), "delivery_tag": delivery.tag}
            if link.snd_settle_mode == 1:  # §2.7.5: on a link sending settled, a delivery's frames say so
                fields["settled"] = True
        aborted = Transfer(handle=UInt(link.output_handle), more=False, aborted=True, **fields)
        frame = self._encode_frame(session.channel, aborted)
        replaced: deque[tuple[OutgoingDelivery, bytes]] = deque()
        for held, held_frame in session.pending:
            if held is not delivery:
                replaced.append((held, held_frame))
            elif delivery.unsent:  # its first held-back frame becomes the aborted transfer; the rest go
                replaced.append((delivery, frame))
                delivery.unsent = 0
        delivery.unsent = 1
        session.pending = replaced
        session.outgoing_unsettled.pop(delivery.delivery_id, None)
        delivery.settled = True
        if self.trace is not None:
            self.trace("->", session.channel, aborted, 0)
        self._pump(session)

    def dispose_incoming(
        self, deliveries: list[IncomingDelivery], state: DeliveryState | None, *, settled: bool = True
    ) -> None:
        """Give the peer's deliveries an outcome (disposition, role=receiver).

        Answering a delivery that is settled at our end already is a ``LocalProtocolError``.
        """
        for delivery in deliveries:
            if delivery.settled:
                raise LocalProtocolError(f"{delivery!r} is settled already")
        self._dispose(deliveries, RECEIVER, state, settled)

    def _dispose(self, deliveries: list[Any], role: bool, state: DeliveryState | None, settled: bool = True) -> None:
        """One disposition per run of consecutive delivery ids on the same session; ``role`` is ours (RECEIVER:
        the peer's deliveries, SENDER: ours)."""
        # the run is kept as its session and ends, not a list: most dispositions answer one delivery (issue 19)
        run_session: Session | None = None
        first = last = 0
        # one delivery (each declare/discharge answer) needs no sort: issue 19's transaction path
        ordered = deliveries if len(deliveries) == 1 else sorted(deliveries, key=_SESSION_ORDER)
        for delivery in ordered:
            session = delivery.link.session
            if session.ended:
                continue
            delivery_id = delivery.delivery_id
            if settled:
                (session.incoming_unsettled if role == RECEIVER else session.outgoing_unsettled).pop(delivery_id, None)
                delivery.settled = True
            if run_session is not session or last + 1 != delivery_id:
                if run_session is not None:
                    self._send_disposition(run_session.channel, first, last, role, state, settled)
                run_session, first = session, delivery_id
            last = delivery_id
        if run_session is not None:
            self._send_disposition(run_session.channel, first, last, role, state, settled)

    def _send_disposition(
        self, channel: int, first: int, last: int, role: bool, state: DeliveryState | None, settled: bool
    ) -> None:
        # the transaction path's answers (accepted, declared, transactional-state) skip the codec: issue 19
        body = self._encode_disposition(role, first, last if last != first else None, settled, state)
        if body is not None and self.trace is None and 8 + len(body) <= self.remote_max_frame_size:
            phase = self.phase
            if phase is not _CLOSE_SENT and phase is not _FINISHED:  # §2.4.3: nothing follows our close
                self._write(FRAME_HEADER.pack(8 + len(body), 2, AMQP_FRAME, channel) + body)
            return
        self._send(
            channel,
            Disposition(
                role=role,
                first=UInt(first),
                last=UInt(last) if last != first else None,
                settled=settled,
                state=state,
            ),
        )

    def complete_drain(self, link: Link) -> None:
        """End a drain: use up the remaining credit and tell the peer (§2.6.7)."""
        if link.state is _DETACHED or not link.drain:
            return
        link.delivery_count = (link.delivery_count + link.credit) & SERIAL_MASK
        link.credit = 0
        link.drain = False
        self._send_link_flow(link, drain=True)

    def set_available(self, link: Link, available: int) -> None:
        """Set how many messages we have ready to send on ``link`` (where we are sender): the ``available`` of our
        next flows on it (§2.7.4: the answer to an echo, the end of a drain)."""
        link.available = available


# the performatives of a session, each with its handler (a transfer's and a disposition's take their fields as a
# tuple: ``_on_frame``)
_SESSION_HANDLERS: dict[type, Callable[..., None]] = {
    End: ServerConnection._on_end,
    Attach: ServerConnection._on_attach,
    Detach: ServerConnection._on_detach,
    Flow: ServerConnection._on_flow,
    Transfer: ServerConnection._on_transfer,
    Disposition: ServerConnection._on_disposition,
}
_PERFORMATIVES = frozenset((Open, Close, Begin, *_SESSION_HANDLERS))  # §2.7: the nine AMQP performatives


# deliveries by session, then id: a C-level key, not a Python function called per delivery (issue 19)
_SESSION_ORDER = attrgetter("link.session.channel", "delivery_id")


def _no_fast_encoding(*_: Any) -> None:
    """The fast encoder of a connection whose performatives carry all their fields: none, use the codec."""
    return None


def _with_short_error(performative: Any, excess: int) -> Any:
    """``performative`` with the description of the error it carries cut by at least ``excess`` bytes (and its
    info dropped), or None when it carries no error worth cutting."""
    state: Any = getattr(performative, "state", None)
    outcome: Any = getattr(state, "outcome", state)  # a rejected outcome, maybe inside a transactional-state
    err = getattr(performative, "error", None) or getattr(outcome, "error", None)
    if not isinstance(err, Error) or not (err.description or err.info):
        return None
    text = (err.description or "").encode()
    keep = max(0, len(text) - excess - 16) if not err.info else max(0, len(text) - excess)
    short = Error(condition=err.condition, description=text[:keep].decode(errors="ignore") + "...")
    if getattr(performative, "error", None) is err:
        return type(performative)(*[short if v is err else v for v in performative.field_values()])
    cut = type(outcome)(error=short)
    new_state = cut if state is outcome else type(state)(txn_id=state.txn_id, outcome=cut)
    return type(performative)(*[new_state if v is state else v for v in performative.field_values()])


_MAX_STATES = 8  # distinct states remembered per incoming delivery: enough to see that they disagree


def _remember_state(delivery: IncomingDelivery, state: object) -> None:
    """Keep an earlier, different state of a multi-frame delivery (once each, and only a few: a peer that keeps
    changing it costs nothing more)."""
    earlier = delivery.earlier_states
    if earlier is None:
        delivery.earlier_states = [state]
    elif len(earlier) < _MAX_STATES and state not in earlier:
        earlier.append(state)


def _states(delivery: IncomingDelivery) -> list[object]:
    """The delivery states the frames of ``delivery`` carried."""
    states = list(delivery.earlier_states or ())
    if delivery.state is not None:
        states.append(delivery.state)
    return states


def _take_range(table: dict[int, Any], first: int, last: int, settled: bool) -> list[Any]:
    """Deliveries in ``table`` with ids in [first, last] (more than one), removed from it when ``settled``."""
    span = (last - first) & SERIAL_MASK
    if span < len(table):
        ids = [(first + i) & SERIAL_MASK for i in range(span + 1)]
        found = [(i, table[i]) for i in ids if i in table]
    else:
        found = [(i, d) for i, d in table.items() if (i - first) & SERIAL_MASK <= span]
    if settled:
        for i, _ in found:
            del table[i]
    return [d for _, d in found]


__all__ = ["Phase", "Scope", "ServerConnection", "Source", "Target"]
