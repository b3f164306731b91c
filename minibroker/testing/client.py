"""A sans-IO AMQP 1.0 client connection: bytes in, frames out, and the bookkeeping a client owes the protocol.

``ClientConnection`` does no I/O and knows no clock, in the shape of h11: the caller writes what
``data_to_send()`` returns and feeds what it reads to ``receive_data()``, then takes protocol headers and
frames from ``next_event()``. Every frame goes both ways through the connection, so it keeps what the
specification makes a client track, whoever chose the values:

* the protocol phase (Part 5 §5.3: after a SASL header come SASL frames up to the outcome, then the next
  header; after an AMQP header, AMQP frames), so pipelined headers and frames are parsed exactly;
* per session (§2.5.6): our channel and the broker's, transfer ids both ways, both incoming windows;
* per link (§2.6.7): handles both ways, delivery-count, link-credit, the delivery being received and its
  frames (a multi-frame delivery is assembled: its last frame carries the whole ``Delivery``);
* sequence numbers (transfer ids, delivery ids and counts) modulo 2^32, differences signed (RFC 1982): a
  disposition range may wrap, and a window or a credit overtaken by what was in flight goes negative.

It never refuses to send a frame: a negative test sends what it likes, and the bookkeeping follows what was
really sent. Drivers move the bytes: ``ScriptedPeer`` (a blocking socket, ``minibroker.testing.peer``),
``MemoryPeer`` (a trio stream, ``minibroker.testing.memory``), the in-memory engine driver of the transaction
tests, and the benchmarks' raw-socket client (``bench.raw.RawClient``); the health check speaks through it too.
Composite steps (SASL, open, begin, attach, close) are written once here as *scripts*: generators that yield
``Send`` and ``Expect`` steps and return the answer, which each driver runs with its own I/O
(``ScriptedPeer.run``, ``MemoryPeer.run``).

    conn = ClientConnection()
    conn.send_header(AMQP_HEADER)
    conn.send(frames.open_("me"))
    sock.sendall(conn.data_to_send())
    conn.receive_data(sock.recv(65536))
    while (event := conn.next_event()) is not None: ...
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from minibroker.amqp.definitions import (
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
    Transfer,
)
from minibroker.amqp.fastpath import decode_performative
from minibroker.amqp.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    FRAME_HEADER,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    encode_frame,
)
from minibroker.amqp.types import DecodeError
from minibroker.testing import frames

P = TypeVar("P")
R = TypeVar("R")

SENDER = frames.SENDER
RECEIVER = frames.RECEIVER

Sasl = str | tuple[str, str, str]
"""``"ANONYMOUS"`` or ``("PLAIN", user, password)``."""


class ProtocolError(ValueError):
    """The broker sent bytes that are not AMQP: a malformed frame header, or a body that does not decode."""


# -- what comes out ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """A protocol header the broker sent (Part 2 §2.2, Part 5 §5.3.1): ``AMQP`` and four bytes."""

    data: bytes


# Delivery and Frame are made for every frame received: plain slotted dataclasses, as a frozen one's __init__
# (object.__setattr__ per field) costs ~1.5 µs more each, a third of a benchmark client's CPU per message.
@dataclass(slots=True)
class Delivery:
    """A delivery the broker is sending us, as of one of its transfer frames (§2.6.12-14)."""

    channel: int
    """Our channel of the session it came on."""
    handle: int
    """Our handle of the link it came on."""
    link: str | None
    """The link's name (None for a handle we never attached)."""
    delivery_id: int
    tag: bytes | None
    settled: bool
    """Settled by the broker when sent (any frame of it had ``settled=true``)."""
    state: Any
    """The delivery state of its last frame that had one."""
    payload: bytes
    """The message bytes of all its frames once ``complete`` (b"" before; what arrived, when aborted)."""
    frames: int
    """Its transfer frames so far (1 on its first frame)."""
    complete: bool
    """Its last frame arrived (``more`` false), or it was aborted."""
    aborted: bool = False


@dataclass(slots=True)
class Frame:
    """One frame the broker sent; ``performative`` is None for an empty frame (a heartbeat, §2.4.5).

    ``link`` is our end of the link the frame concerns; ``delivery`` is set on every transfer frame of a
    delivery on one of our links: on its last frame (``more`` false, or ``aborted``) it is ``complete`` and
    holds the whole message.
    """

    channel: int
    frame_type: int
    performative: Any
    payload: bytes = b""
    delivery: Delivery | None = None
    link: Link | None = None
    """Our link a link-level frame (attach, flow with a handle, transfer, detach) concerns, if it is one."""

    @property
    def is_heartbeat(self) -> bool:
        """True for an empty frame."""
        return self.performative is None

    def __repr__(self) -> str:
        kind = "sasl " if self.frame_type == SASL_FRAME else ""
        extra = f", payload={len(self.payload)} bytes" if self.payload else ""
        return f"Frame({kind}ch={self.channel}, {self.performative!r}{extra})"


@dataclass(frozen=True, slots=True)
class Ended:
    """The broker closed the byte stream; ``partial`` bytes of an unfinished frame were left."""

    partial: int = 0


Event = ProtocolHeader | Frame | Ended


# -- parsing ----------------------------------------------------------------------------------------------
class FrameReader:
    """Incremental parser of what a broker sends: protocol headers and frames (Part 2 §2.3.1).

    ``headers`` says how the next bytes are read: a header is expected at the start, after the broker's
    SASL outcome (§5.3.2) and whenever the caller says so (``expect_header``); anything else is a frame.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.header_next = True
        """The next 8 bytes are a protocol header."""
        self.max_frame_size: int | None = None
        """The largest frame we take (our ``open``'s max-frame-size), None: any."""

    def feed(self, data: bytes) -> None:
        """Add bytes received from the broker."""
        self._buf += data

    def __len__(self) -> int:
        return len(self._buf)

    def next_header(self) -> bytes | None:
        """The next 8 bytes as a protocol header, or None if fewer have arrived."""
        if len(self._buf) < 8:
            return None
        header = bytes(self._buf[:8])
        del self._buf[:8]
        self.header_next = False
        return header

    def next_frame(self) -> tuple[int, int, Any, bytes] | None:
        """``(channel, type, performative, payload)`` of the next whole frame, None if it has not all arrived.

        The performative is None for an empty frame. Raises ``ProtocolError`` on bytes that are not a frame.
        """
        buf = self._buf
        if len(buf) < 8:
            return None
        size, doff, frame_type, channel = FRAME_HEADER.unpack_from(buf)
        if size < 8 or doff < 2 or doff * 4 > size:
            raise ProtocolError(f"malformed frame header: size={size} doff={doff} (bytes {bytes(buf[:8])!r})")
        if self.max_frame_size is not None and size > self.max_frame_size:
            # §2.7.1 open: a peer MUST NOT send frames larger than our max-frame-size
            raise ProtocolError(f"a frame of {size} bytes, over our max-frame-size {self.max_frame_size}")
        if len(buf) < size:
            return None
        body = bytes(buf[doff * 4 : size])
        del buf[:size]
        if not body:
            return channel, frame_type, None, b""
        try:
            performative, end = decode_performative(body)
        except DecodeError as exc:
            raise ProtocolError(f"frame body does not decode: {exc}") from None
        return channel, frame_type, performative, body[end:]


def parse_frames(data: bytes) -> list[Frame]:
    """Every frame in ``data``, which must hold whole frames only (``ProtocolError`` otherwise)."""
    reader = FrameReader()
    reader.header_next = False
    reader.feed(data)
    found = []
    while (parsed := reader.next_frame()) is not None:
        found.append(Frame(*parsed))
    if len(reader):
        raise ProtocolError(f"{len(reader)} bytes left after the last whole frame")
    return found


def split_header(data: bytes) -> tuple[bytes, bytes]:
    """Split a leading protocol header (``AMQP`` + 4 bytes) from the frames after it."""
    if not data.startswith(b"AMQP") or len(data) < 8:
        raise ProtocolError(f"no protocol header at the start of {data[:16]!r}")
    return data[:8], data[8:]


# -- bookkeeping ------------------------------------------------------------------------------------------
@dataclass
class Link:
    """Our end of one link (§2.6): what each side counted."""

    name: str
    handle: int
    role: bool
    """``SENDER`` when we send on it."""
    remote_handle: int | None = None
    remote_attach: Attach | None = None
    delivery_count: int = 0
    """Deliveries sent on the link so far (§2.6.7), counted from the sender's initial delivery-count."""
    credit: int = 0
    """Deliveries the sender may still send (for our receiver: what we granted, minus what arrived); serial
    arithmetic, so negative when a grant was overtaken by more deliveries than it gave."""
    available: int | None = None
    """The broker's last ``available`` for our receiver links."""
    drain: bool = False
    sending: int | None = None
    """Delivery id of a multi-frame delivery we are in the middle of sending."""
    receiving: _Incoming | None = None
    detached: bool = False
    """We sent our detach."""
    remote_detach: Detach | None = None


@dataclass
class _Incoming:
    delivery_id: int
    tag: bytes | None
    settled: bool
    state: Any
    parts: list[bytes] = field(default_factory=list)


@dataclass
class Session:
    """Our end of one session (§2.5): channels and the transfer-id / window sequences both ways."""

    channel: int
    next_outgoing_id: int
    """The transfer id our next transfer frame gets."""
    window: int
    """The incoming window we last announced (in our ``begin`` or a ``flow``)."""
    incoming_window: int = 0
    """Transfer frames we still take: ``window`` less what arrived since we announced it."""
    remote_channel: int | None = None
    next_incoming_id: int = 0
    """The transfer id we expect next from the broker."""
    remote_incoming_window: int = 0
    """Transfer frames the broker still takes from us (§2.5.6); negative when we sent beyond its window."""
    remote_outgoing_window: int = 0
    next_delivery_id: int = 0
    """The delivery id our next delivery gets (when the caller lets the connection choose)."""
    links: dict[int, Link] = field(default_factory=dict)
    """Our links by our handle."""
    by_remote: dict[int, Link] = field(default_factory=dict)
    """Our links by the broker's handle."""
    unsettled: dict[int, Link] = field(default_factory=dict)
    """Deliveries we received completely and unsettled, that neither side has settled: id -> link."""
    ended: bool = False
    remote_end: End | None = None
    initial_outgoing_id: int = 0
    """Our ``begin``'s next-outgoing-id: a broker ``flow`` without next-incoming-id counts its window from it."""
    remote_attaches: dict[int, Attach] = field(default_factory=dict)
    """Attaches the broker sent first, for links we have not attached (yet), by the broker's handle."""

    def link(self, name: str) -> Link:
        """Our link called ``name`` (``KeyError`` if there is none)."""
        for link in self.links.values():
            if link.name == name:
                return link
        raise KeyError(name)

    def next_handle(self) -> int:
        """The lowest handle no link of ours holds."""
        handle = 0
        while handle in self.links:
            handle += 1
        return handle


def _u32(value: int) -> int:
    return value & 0xFFFFFFFF


def _serial_diff(a: int, b: int) -> int:
    """``a - b`` for sequence numbers modulo 2^32 (§2.8.10 sequence-no, RFC 1982): signed, within ±2^31."""
    return ((a - b + 0x80000000) & 0xFFFFFFFF) - 0x80000000


def _settle(unsettled: dict[int, Link], first: int, last: int | None) -> None:
    """Forget the deliveries ``first``..``last`` (serial numbers, so the range may wrap) of ``unsettled``."""
    span = 0 if last is None else _u32(last - first)
    for delivery_id in [d for d in unsettled if _u32(d - first) <= span]:
        del unsettled[delivery_id]


class ClientConnection:
    """The client side of one AMQP connection, without I/O (see the module docstring)."""

    def __init__(self) -> None:
        self.reader = FrameReader()
        self._out = bytearray()
        self.sessions: dict[int, Session] = {}
        """Our sessions by our channel."""
        self._by_remote_channel: dict[int, Session] = {}
        self._remote_begins: dict[int, Begin] = {}
        self._sasl_layer = False
        """The broker's last header was the SASL one and its outcome has not come yet."""
        """Begins the broker sent first (no remote-channel), by its channel, until we answer one."""
        self.remote_open: Open | None = None
        self.remote_close: Close | None = None
        self.sasl_outcome: SaslOutcome | None = None
        self.ended = False
        """The broker closed the byte stream."""
        self.violations: list[str] = []
        """Frames a correct broker can never send us (a transfer beyond our window, on no link of ours, on a link
        where we send or after the broker detached it, a continuation with no delivery in progress, a delivery
        settled by the broker before all of it came). Nothing is answered on our behalf: a ``flow`` with
        ``echo`` set, or the broker's ``end`` or ``detach``, is the caller's to answer."""

    # -- output -----------------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Everything sent since the last call, to write to the broker."""
        data = bytes(self._out)
        self._out.clear()
        return data

    def send_raw(self, data: bytes) -> None:
        """Bytes exactly as given (no bookkeeping)."""
        self._out += data

    def send_header(self, header: bytes = AMQP_HEADER) -> None:
        """A protocol header (any 8 bytes, or fewer or more for a negative test)."""
        self._out += header

    def send(self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        """One frame; the connection's state follows what it says."""
        self._out += encode_frame(channel, performative, payload, frame_type)
        self._sent(performative, channel)

    def send_encoded(self, data: bytes | bytearray, performative: Any, channel: int = 0) -> None:
        """One frame the caller encoded itself (pre-encoded or patched from a template, for speed): ``data`` is
        written as given and the bookkeeping follows ``performative``, which must be what ``data`` carries."""
        self._out += data
        self._sent(performative, channel)

    def _sent(self, perf: Any, channel: int) -> None:
        if isinstance(perf, Transfer):
            self._sent_transfer(perf, channel)
            return
        if isinstance(perf, Open) and perf.max_frame_size is not None:  # (a negative test may send less than 512)
            self.reader.max_frame_size = max(MIN_MAX_FRAME_SIZE, int(perf.max_frame_size))
        session = self.sessions.get(channel)
        if isinstance(perf, Begin):
            next_outgoing_id = int(perf.next_outgoing_id or 0)
            window = int(perf.incoming_window or 0)
            session = Session(channel, next_outgoing_id, window, window, initial_outgoing_id=next_outgoing_id)
            self.sessions[channel] = session
            if perf.remote_channel is not None:  # §2.5.2: we answer a session the broker began
                theirs = self._remote_begins.pop(int(perf.remote_channel), None)
                if theirs is not None:
                    self._bind_session(session, int(perf.remote_channel), theirs)
        elif session is None:
            return
        elif isinstance(perf, Attach) and perf.handle is not None:
            new = Link(str(perf.name), int(perf.handle), bool(perf.role))
            if perf.role == SENDER:
                new.delivery_count = int(perf.initial_delivery_count or 0)
            session.links[new.handle] = new
            # the broker attached first: ours answers its attach of the same name and the other role (§2.6.3)
            pushed = next(
                (a for a in session.remote_attaches.values() if a.name == perf.name and a.role != new.role), None
            )
            if pushed is not None and pushed.handle is not None:
                del session.remote_attaches[int(pushed.handle)]
                self._bind_link(session, new, pushed)
        elif isinstance(perf, Flow):
            if perf.incoming_window is not None:
                session.window = session.incoming_window = int(perf.incoming_window)
            link = session.links.get(int(perf.handle)) if perf.handle is not None else None
            if link is None:
                pass
            elif link.role == RECEIVER and perf.link_credit is not None:
                # §2.6.7: the sender grants from the delivery-count we sent (ours, when we sent none)
                count = link.delivery_count if perf.delivery_count is None else int(perf.delivery_count)
                link.credit = _serial_diff(count + int(perf.link_credit), link.delivery_count)
                link.drain = bool(perf.drain)
            elif link.role == SENDER and perf.delivery_count is not None:
                # §2.6.7: a sender that drains advances its delivery-count, consuming the credit
                link.credit -= _serial_diff(int(perf.delivery_count), link.delivery_count)
                link.delivery_count = int(perf.delivery_count)
        elif isinstance(perf, Detach) and perf.handle is not None:
            link = session.links.get(int(perf.handle))
            if link is not None:
                link.detached = True
                self._forget_if_gone(session, link)
        elif isinstance(perf, Disposition) and perf.role == RECEIVER and perf.settled:
            _settle(session.unsettled, int(perf.first or 0), None if perf.last is None else int(perf.last))
        elif isinstance(perf, End):
            session.ended = True
            self._forget_session_if_gone(session)

    def _sent_transfer(self, perf: Transfer, channel: int) -> None:
        session = self.sessions.get(channel)
        if session is None:
            return
        session.next_outgoing_id = _u32(session.next_outgoing_id + 1)
        session.remote_incoming_window -= 1
        link = session.links.get(int(perf.handle)) if perf.handle is not None else None
        if link is None:
            return
        if link.sending is None and (perf.delivery_id is not None or not perf.aborted):  # a delivery's first frame
            if perf.delivery_id is not None:
                session.next_delivery_id = _u32(int(perf.delivery_id) + 1)
                link.sending = int(perf.delivery_id)
            link.delivery_count = _u32(link.delivery_count + 1)
            link.credit -= 1
        if not perf.more or perf.aborted:
            link.sending = None

    # -- input ------------------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        """Bytes read from the broker; ``b""`` when the stream has ended."""
        if data:
            self.reader.feed(data)
        else:
            self.ended = True

    def expect_header(self) -> None:
        """The broker's next bytes are a protocol header (after we sent one in the middle of a negative test)."""
        self.reader.header_next = True

    def next_event(self) -> Event | None:
        """The next header or frame that has wholly arrived; ``Ended`` once the stream ended; None: read more.

        Raises ``ProtocolError`` for bytes that are not AMQP.
        """
        reader = self.reader
        if reader.header_next:
            header = reader.next_header()
            if header is not None:
                self._sasl_layer = header == SASL_HEADER
                return ProtocolHeader(header)
        else:
            parsed = reader.next_frame()
            if parsed is not None:
                return self._received(*parsed)
        return Ended(len(reader)) if self.ended else None

    def _received(self, channel: int, frame_type: int, perf: Any, payload: bytes) -> Frame:
        delivery = link = None
        if self.remote_close is not None:  # §2.4.3: the close "MUST be the last thing ever written"
            self.violations.append(f"a frame after the broker's close: {perf!r} on channel {channel}")
        if perf is not None and (frame_type == SASL_FRAME) != self._sasl_layer:
            # Part 5 §5.3.2: SASL frames (type 1) up to the outcome; after the AMQP header, AMQP frames (§2.3.2)
            layer = "the SASL exchange" if self._sasl_layer else "the AMQP layer"
            self.violations.append(
                f"a {'SASL' if frame_type == SASL_FRAME else 'type ' + str(frame_type)} frame in {layer}"
            )
            if isinstance(perf, SaslOutcome):
                return Frame(channel, frame_type, perf, payload)
        if perf is None:
            pass
        elif isinstance(perf, Transfer):
            delivery, link = self._received_transfer(perf, channel, payload)
        elif isinstance(perf, SaslOutcome):
            self.sasl_outcome = perf
            # §5.3.2: the next layer's header follows a successful outcome; after a failed one, nothing does
            self.reader.header_next = perf.code == 0
            self._sasl_layer = False
        elif isinstance(perf, Open):
            self.remote_open = perf
        elif isinstance(perf, Close):
            self.remote_close = perf
        elif isinstance(perf, Begin):
            self._received_begin(perf, channel)
        elif isinstance(perf, Attach | Flow | Detach | Disposition | End):
            session = self._by_remote_channel.get(channel)
            if session is not None:
                link = self._received_on_session(session, perf)
            elif channel not in self._remote_begins:
                # §2.8.15 errant-link / §2.5.4: session frames need a session begun on that channel
                self.violations.append(
                    f"{type(perf).__name__.lower()} on channel {channel}, where no session of ours is"
                )
        return Frame(channel, frame_type, perf, payload, delivery, link)

    def _received_begin(self, perf: Begin, channel: int) -> None:
        ours = perf.remote_channel
        if ours is None:  # §2.5.2: the broker begins a session; ours answers it
            self._remote_begins[channel] = perf
            return
        session = self.sessions.get(int(ours))
        if session is None:
            self.violations.append(f"begin answering our channel {int(ours)}, where we began no session")
        else:
            self._bind_session(session, channel, perf)

    def _bind_session(self, session: Session, channel: int, perf: Begin) -> None:
        session.remote_channel = channel
        session.next_incoming_id = int(perf.next_outgoing_id or 0)
        # §2.5.6: the broker's incoming window counts from the first transfer id we announced
        window = int(perf.incoming_window or 0)
        session.remote_incoming_window = _serial_diff(session.initial_outgoing_id + window, session.next_outgoing_id)
        session.remote_outgoing_window = int(perf.outgoing_window or 0)
        self._by_remote_channel[channel] = session

    @staticmethod
    def _bind_link(session: Session, link: Link, perf: Attach) -> None:
        link.remote_handle = int(perf.handle or 0)
        link.remote_attach = perf
        session.by_remote[link.remote_handle] = link
        if link.role == RECEIVER:
            link.delivery_count = int(perf.initial_delivery_count or 0)

    def _received_on_session(self, session: Session, perf: Any) -> Link | None:
        """Count a session- or link-level frame; return the link it concerns, if any."""
        if isinstance(perf, Attach):
            if perf.handle is None:
                return None
            # §2.6.1: a link is named per direction, so ours has the same name and the other role
            link = next(
                (
                    k
                    for k in session.links.values()
                    if k.name == perf.name and k.role != perf.role and k.remote_handle is None
                ),
                None,
            )
            if link is None:  # the broker attaches first: bound when we answer
                session.remote_attaches[int(perf.handle)] = perf
            else:
                self._bind_link(session, link, perf)
            return link
        if isinstance(perf, Flow):
            # §2.5.6: remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id, or
            # from initial-outgoing-id when the flow has no next-incoming-id; serial arithmetic, so signed
            start = session.initial_outgoing_id if perf.next_incoming_id is None else int(perf.next_incoming_id)
            session.remote_incoming_window = _serial_diff(
                start + int(perf.incoming_window or 0), session.next_outgoing_id
            )
            session.remote_outgoing_window = int(perf.outgoing_window or 0)
            link = session.by_remote.get(int(perf.handle)) if perf.handle is not None else None
            if link is None:
                return None
            if link.role == SENDER and perf.link_credit is not None:
                # §2.6.7: link-credit(snd) := delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
                count = link.delivery_count if perf.delivery_count is None else int(perf.delivery_count)
                link.credit = _serial_diff(count + int(perf.link_credit), link.delivery_count)
                link.drain = bool(perf.drain)
            elif link.role == RECEIVER:
                link.available = None if perf.available is None else int(perf.available)
                if perf.delivery_count is not None:  # the sender advanced it (a drain) past what arrived
                    link.credit -= _serial_diff(int(perf.delivery_count), link.delivery_count)
                    link.delivery_count = int(perf.delivery_count)
            return link
        if isinstance(perf, Detach) and perf.handle is not None:
            link = session.by_remote.get(int(perf.handle))
            if link is not None:
                link.remote_detach = perf
                self._forget_if_gone(session, link)
            else:  # a detach refusing an attach the broker sent first
                session.remote_attaches.pop(int(perf.handle), None)
            return link
        if isinstance(perf, Disposition) and perf.role == SENDER and perf.settled:
            self._settled_by_broker(session, perf)
        elif isinstance(perf, End):
            session.remote_end = perf
            self._forget_session_if_gone(session)
        return None

    def _received_transfer(self, perf: Transfer, channel: int, payload: bytes) -> tuple[Delivery | None, Link | None]:
        """Count a transfer frame; the delivery as of it and the link it came on (None, None when it is not ours)."""
        session = self._by_remote_channel.get(channel)
        if session is None:
            self.violations.append(f"transfer on channel {channel}, where no session of ours is")
            return None, None
        session.next_incoming_id = _u32(session.next_incoming_id + 1)
        session.incoming_window -= 1
        session.remote_outgoing_window -= 1
        if session.incoming_window < 0:
            self.violations.append(f"transfer {session.next_incoming_id - 1} beyond our incoming window (§2.5.6)")
        link = session.by_remote.get(int(perf.handle)) if perf.handle is not None else None
        if link is None:
            self.violations.append(f"transfer on handle {perf.handle}, which is no link of ours (any more)")
            return None, None
        if link.role == SENDER:  # §2.6.12: only a link's sender transfers on it
            self.violations.append(f"transfer on {link.name}, a link on which we send")
            return None, None
        if link.remote_detach is not None:
            self.violations.append(f"transfer on {link.name} after the broker detached it")
            return None, None
        current = link.receiving
        if current is None:
            if perf.delivery_id is None:
                self.violations.append(f"continuation frame on {link.name} with no delivery in progress")
                return None, link
            link.delivery_count = _u32(link.delivery_count + 1)
            link.credit -= 1
            if not perf.more:  # a whole delivery in one frame, the usual case: nothing to assemble
                delivery_id, settled, aborted = int(perf.delivery_id), bool(perf.settled), bool(perf.aborted)
                if not settled and not aborted:
                    session.unsettled[delivery_id] = link
                delivery = Delivery(session.channel, link.handle, link.name, delivery_id, perf.delivery_tag, settled,
                                    perf.state, payload, 1, True, aborted)  # fmt: skip
                return delivery, link
            current = link.receiving = _Incoming(
                int(perf.delivery_id), perf.delivery_tag, bool(perf.settled), perf.state
            )
        else:
            if perf.delivery_id is not None and perf.delivery_id != current.delivery_id:
                self.violations.append(
                    f"delivery {perf.delivery_id} began on {link.name} inside delivery {current.delivery_id}"
                )
            current.settled = current.settled or bool(perf.settled)
            if perf.state is not None:
                current.state = perf.state
        current.parts.append(payload)
        complete = not perf.more or bool(perf.aborted)
        if complete:
            link.receiving = None
            if not current.settled and not perf.aborted:
                session.unsettled[current.delivery_id] = link
        delivery = Delivery(
            session.channel,
            link.handle,
            link.name,
            current.delivery_id,
            current.tag,
            current.settled,
            current.state,
            b"".join(current.parts) if complete else b"",
            len(current.parts),
            complete,
            bool(perf.aborted),
        )
        return delivery, link

    def _settled_by_broker(self, session: Session, perf: Disposition) -> None:
        """The broker, as sender, settles deliveries it sent us: each must be one we hold (§2.7.6)."""
        first = int(perf.first or 0)
        span = 0 if perf.last is None else _u32(int(perf.last) - first)
        for link in session.links.values():
            if link.receiving is not None and _u32(link.receiving.delivery_id - first) <= span:
                delivery_id = link.receiving.delivery_id
                self.violations.append(f"the broker settled delivery {delivery_id} before sending all of it")
        # (one we settled already may cross the broker's settling in flight)
        _settle(session.unsettled, first, None if perf.last is None else int(perf.last))

    @staticmethod
    def _forget_if_gone(session: Session, link: Link) -> None:
        """A link detached by both sides frees its handles (§2.6.3); either may already hold a new link."""
        if link.detached and link.remote_detach is not None:
            if session.links.get(link.handle) is link:
                del session.links[link.handle]
            if link.remote_handle is not None and session.by_remote.get(link.remote_handle) is link:
                del session.by_remote[link.remote_handle]

    def _forget_session_if_gone(self, session: Session) -> None:
        """A session ended by both sides frees the broker's channel (§2.5.4); ours stays readable until reused."""
        channel = session.remote_channel
        if not session.ended or session.remote_end is None or channel is None:
            return
        if self._by_remote_channel.get(channel) is session:
            del self._by_remote_channel[channel]

    # -- reading the state ------------------------------------------------------------------------------
    def session(self, channel: int = 0) -> Session:
        """Our session on ``channel`` (``KeyError`` before we began one there)."""
        return self.sessions[channel]

    @property
    def remote_channels(self) -> dict[int, int]:
        """Our channel -> the broker's channel, for each session the broker answered and not both sides ended."""
        return {s.channel: c for c, s in self._by_remote_channel.items()}

    # -- frames with the bookkeeping filled in ----------------------------------------------------------
    def flow(
        self, handle: int | None = None, link_credit: int | None = None, *, channel: int = 0, **fields: Any
    ) -> Flow:
        """A ``flow`` whose session fields (and, for a link, ``delivery_count``) say what this end knows; the
        incoming window is opened again to what we last announced.

        Any field given wins; pass ``delivery_count=None`` to leave it null.
        """
        session = self.sessions.get(channel)
        if session is not None:
            fields.setdefault("next_incoming_id", session.next_incoming_id)
            fields.setdefault("next_outgoing_id", session.next_outgoing_id)
            fields.setdefault("incoming_window", session.window)
            link = session.links.get(handle) if handle is not None else None
            # §2.7.4: a receiver that has not seen the sender's attach MUST NOT set delivery-count
            if link is not None and (link.role == SENDER or link.remote_attach is not None):
                fields.setdefault("delivery_count", link.delivery_count)
        return frames.flow(handle=handle, link_credit=link_credit, **fields)

    def next_delivery_id(self, channel: int = 0) -> int:
        """The delivery id our next delivery on ``channel`` should carry (§2.7.5: consecutive per session)."""
        return self.sessions[channel].next_delivery_id


# -- composite steps, written once for every driver ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """A script step: write this frame (or, with ``header``, these raw header bytes)."""

    performative: Any = None
    channel: int = 0
    payload: bytes = b""
    frame_type: int = AMQP_FRAME
    header: bytes | None = None


@dataclass(frozen=True, slots=True)
class Expect:
    """A script step: the next frame (heartbeats aside) must carry a ``kind`` (any kind when None) on
    ``channel`` (any when None); with ``header``, the next bytes must be that protocol header instead.
    The driver answers the step with the ``Frame`` (or the ``ProtocolHeader``)."""

    kind: type | None = None
    channel: int | None = None
    header: bytes | None = None
    sasl: bool = False
    """The frame must be a SASL frame (type 1)."""


Script = Generator[Send | Expect, Any, R]
"""A composite step: yields what to send and what to expect, returns the answer."""


def authenticate(sasl: Sasl = "ANONYMOUS") -> Script[SaslOutcome]:
    """SASL header exchange, mechanisms, init (Part 5 §5.3.2); returns the broker's outcome, unchecked."""
    yield Send(header=SASL_HEADER)
    yield Expect(header=SASL_HEADER)
    yield Expect(SaslMechanisms, 0, sasl=True)
    if sasl == "ANONYMOUS":
        init = frames.sasl_anonymous()
    elif isinstance(sasl, tuple) and sasl[0] == "PLAIN":
        init = frames.sasl_plain(sasl[1], sasl[2])
    else:
        raise ValueError(f"unsupported SASL choice {sasl!r}")
    yield Send(init, frame_type=SASL_FRAME)
    outcome: SaslOutcome = (yield Expect(SaslOutcome, 0, sasl=True)).performative
    return outcome


def open_connection(open_: Open, sasl: Sasl | None = None) -> Script[Open]:
    """Optional SASL (which must succeed), the AMQP header exchange, our ``open``; returns the broker's."""
    if sasl is not None:
        outcome = yield from authenticate(sasl)
        if outcome.code != 0:
            raise AssertionError(f"SASL failed: {outcome!r}")
    yield Send(header=AMQP_HEADER)
    yield Expect(header=AMQP_HEADER)
    yield Send(open_)
    remote: Open = (yield Expect(Open, 0)).performative
    return remote


def begin_session(begin: Begin, channel: int) -> Script[Begin]:
    """Our ``begin`` on ``channel``; returns the broker's, which must answer that channel."""
    yield Send(begin, channel)
    reply: Begin = (yield Expect(Begin)).performative
    if reply.remote_channel != channel:
        raise AssertionError(f"begin answered for channel {reply.remote_channel}, not {channel}")
    return reply


def attach_link(attach: Attach, channel: int) -> Script[Attach]:
    """Our ``attach`` on ``channel``; returns the broker's (a ``flow`` often follows: expect it yourself)."""
    yield Send(attach, channel)
    reply: Attach = (yield Expect(Attach)).performative
    return reply


def close_connection(close: Close) -> Script[Close]:
    """Our ``close``; skips what the broker sent before it saw it, returns its ``close`` (the driver then
    expects the end of the stream)."""
    yield Send(close)
    while not isinstance((frame := (yield Expect())).performative, Close):
        pass
    reply: Close = frame.performative
    return reply


def check(step: Expect, event: ProtocolHeader | Frame, received: list[Frame]) -> None:
    """Fail with an ``AssertionError`` unless ``event`` is what ``step`` expects; the message shows the last of
    the frames ``received``."""
    if step.header is not None:
        if not isinstance(event, ProtocolHeader) or event.data != step.header:
            raise AssertionError(f"expected the protocol header {step.header!r}, got {event!r}")
        return
    if not isinstance(event, Frame):
        raise AssertionError(f"expected a frame, got {event!r}")
    kind = step.kind
    if (kind is not None and not isinstance(event.performative, kind)) or (
        step.channel is not None and event.channel != step.channel
    ):
        name = "a frame" if kind is None else kind.__name__
        where = "" if step.channel is None else f" on channel {step.channel}"
        raise AssertionError(f"expected {name}{where}, got {event!r}{recent(received)}")
    if step.sasl and event.frame_type != SASL_FRAME:
        raise AssertionError(f"expected a SASL frame (type 1), got type {event.frame_type}: {event!r}")


def recent(received: list[Frame], count: int = 5) -> str:
    """The last ``count`` frames (heartbeats aside) for an assertion message."""
    last: list[Frame] = []
    for frame in reversed(received):  # from the end: a long-lived peer has received many
        if len(last) == count:
            break
        if not frame.is_heartbeat:
            last.insert(0, frame)
    return "; last frames received: " + ", ".join(map(repr, last)) if last else "; no frame received"


class ScriptRun(Generic[R]):
    """Steps through a script for a driver: queues each ``Send`` into the connection (the driver then writes
    ``data_to_send()``) and stops at each ``Expect``, which the driver answers by reading."""

    def __init__(self, conn: ClientConnection, script: Script[R]) -> None:
        self.conn = conn
        self.script = script
        self.result: R | None = None
        """What the script returned, once ``advance`` returned None."""

    def advance(self, answer: Any = None) -> Expect | None:
        """Give the script ``answer`` (the event its last ``Expect`` asked for); the next ``Expect``, or None
        when the script has finished."""
        try:
            step = self.script.send(answer)
            while isinstance(step, Send):
                if step.header is not None:
                    self.conn.send_header(step.header)
                else:
                    self.conn.send(step.performative, step.channel, step.payload, step.frame_type)
                step = self.script.send(None)
        except StopIteration as stop:
            self.result = stop.value
            return None
        return step


__all__ = [
    "RECEIVER",
    "SENDER",
    "ClientConnection",
    "Delivery",
    "Ended",
    "Event",
    "Expect",
    "Frame",
    "FrameReader",
    "Link",
    "ProtocolError",
    "ProtocolHeader",
    "Sasl",
    "Script",
    "ScriptRun",
    "Send",
    "Session",
    "attach_link",
    "authenticate",
    "begin_session",
    "check",
    "close_connection",
    "open_connection",
    "parse_frames",
    "recent",
    "split_header",
]
