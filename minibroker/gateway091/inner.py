"""The inner client: a sans-IO AMQP 1.0 client the 0-9-1 gateway drives its in-process ``ServerConnection`` with.

Theory of operation
-------------------
The gateway speaks 0-9-1 to its peer and AMQP 1.0 to the broker core, through an ordinary ``ServerConnection``
fed in memory: ``data_to_send()`` is what goes into ``inner.receive_events(data, now)``, and what
``inner.data_to_send()`` produces comes back through ``receive_data(data)``, which returns ``InnerEvent``s. Each
command (``start``, ``begin``, ``attach_sender`` ...) only queues bytes, so the gateway pumps both ways until
neither side has anything to say.

What the protocol asks of a client is kept here, so the gateway thinks in channels and handles only:

* the header exchange and SASL (Part 5 §5.3), pipelined: SASL header, ``sasl-init`` (PLAIN with credentials,
  ANONYMOUS without), AMQP header and ``open`` go out at once, as the engine reads them in order;
* per session (§2.5.6): the broker's channel, transfer ids both ways, its incoming window (our transfers wait
  while it is closed) and ours, announced huge and opened again with a session ``flow`` when half used;
* per link (§2.6.7): handles both ways (a handle is free again only when both ends detached, §2.6.3),
  delivery-count and link-credit; a delivery waits for credit;
* delivery ids (§2.7.5), consecutive per session, and which of ours are unsettled, so each range of a
  ``disposition`` becomes one ``Outcome`` per delivery.

Order is the session's: a transfer that waits (no credit yet, the broker's window closed) holds back every
later transfer of its session, so a ``discharge`` never overtakes the transactional posts before it (Part 4
§4.4.1), and delivery ids go out in order. Frames that need neither credit nor window (flow, disposition) go
at once; a ``detach``, an ``end`` and the ``close`` wait behind what waits, so a 0-9-1 client's publishes
before its channel.close or connection.close are not lost. What waits on a link the broker detached, or in a
session it ended, is dropped (the broker would drop it too).

Not here on purpose: any 0-9-1 meaning (the gateway's), message encoding (``convert``), deciding what credit
to grant. The broker end is our own engine, so bytes that do not decode raise ``InnerProtocolError`` (a bug,
never a peer's input); a command naming an unknown channel or handle raises ``LocalProtocolError``.

Fast path: a publish is one ``transfer`` call that appends a frame header, a transfer performative built from
bytes pre-encoded per link (handle; fixed-width delivery id and 4-octet tag), and the payload.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    Attach,
    Begin,
    Close,
    Coordinator,
    Declare,
    Detach,
    Discharge,
    Disposition,
    End,
    Error,
    Flow,
    Open,
    SaslInit,
    SaslOutcome,
    Source,
    Target,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import LocalProtocolError
from minibroker.amqp.fastpath import TRANSFER_PREFIX, decode_performative, encode_transfer
from minibroker.amqp.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    FRAME_HEADER,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    encode_frame,
)
from minibroker.amqp.states import DeliveryState
from minibroker.amqp.types import DecodeError, Symbol, UByte, UInt

SENDER = False  # §2.8.1 role
RECEIVER = True
MASK = 0xFFFFFFFF  # §2.8.10 sequence-no: serial arithmetic modulo 2^32 (RFC 1982)
DEFAULT_WINDOW = 1 << 30
"""Our session incoming window: transfer frames the broker may send before we open it again."""
TXN_CAPABILITY = Symbol("amqp:local-transactions")  # Part 4 §4.5.6 txn-capability
# a controller lists rejected among its outcomes: it hears errors as rejected (Part 4 §4.3)
_OUTCOMES: list[str] = [Symbol("amqp:accepted:list"), Symbol("amqp:rejected:list")]
_ID_TAG = struct.Struct(">IBBI")  # delivery-id as uint (0x70 + 4 octets), then a vbin8 of 4 octets: the tag
_UINT32 = 0x70
_VBIN8 = 0xA0
_TAIL_SETTLED = b"\x43\x41"  # message-format 0 (uint0), settled true
_TAIL_UNSETTLED = b"\x43\x42"  # message-format 0, settled false
_NOT_MORE = b"\x42\x40"  # more false, rcv-settle-mode null: before a state


class InnerProtocolError(ValueError):
    """The inner engine wrote bytes that are not AMQP: a bug in one of the two ends, never the 0-9-1 peer's doing."""


# -- events -------------------------------------------------------------------------------------------------
# Plain slotted dataclasses, as the engine's events: one is made per message (``Delivered``, ``Outcome``), and a
# frozen dataclass's __init__ costs more each (see ``minibroker.testing.client.Delivery``).
@dataclass(slots=True)
class SaslDone:
    """The broker's SASL outcome (Part 5 §5.3.3.6); after a refusal it closes the stream."""

    ok: bool


@dataclass(slots=True)
class Opened:
    """The broker's ``open`` arrived (§2.7.1)."""


@dataclass(slots=True)
class Attached:
    """The broker answered our attach; ``error`` set when it refused it (a null terminus, then a detach with the
    reason, §2.6.3): the handle is free again."""

    channel: int
    handle: int
    error: Error | None = None


@dataclass(slots=True)
class Detached:
    """A link is gone at both ends: the broker detached it (``error``: why; we answered), or it answered our
    detach. Deliveries we sent on it that had no outcome get none."""

    channel: int
    handle: int
    error: Error | None = None


@dataclass(slots=True)
class Credit:
    """The broker's ``flow`` for a link (§2.6.7): what credit the link has now (where we send: left after the
    deliveries waiting for it went; where we receive: what is still unused), and the drain flag (a receiver's
    drain came back: ``credit`` 0 and ``drain`` true mean the queue had no more)."""

    channel: int
    handle: int
    credit: int
    drain: bool


@dataclass(slots=True)
class Outcome:
    """The broker's disposition of one delivery we sent (one per delivery of a range, §2.7.6); ``state`` is an
    outcome, ``declared`` (Part 4 §4.5.3) or a transactional-state."""

    channel: int
    handle: int
    delivery_id: int
    state: Any
    settled: bool


@dataclass(slots=True)
class Delivered:
    """A whole message the broker sent on one of our receiver links (frames assembled, §2.6.14)."""

    channel: int
    handle: int
    delivery_id: int
    payload: bytes
    settled: bool


@dataclass(slots=True)
class Ended:
    """A session is over at both ends: the broker ended it (``error``: why; we answered) or answered our end."""

    channel: int
    error: Error | None = None


@dataclass(slots=True)
class Closed:
    """The connection is over: the broker closed it (``error``: why; we answered) or answered our close."""

    error: Error | None = None


InnerEvent = SaslDone | Opened | Attached | Detached | Credit | Outcome | Delivered | Ended | Closed


# -- bookkeeping --------------------------------------------------------------------------------------------
class _Link:
    """Our end of one link."""

    __slots__ = (
        "channel",
        "credit",
        "delivery_count",
        "detached",
        "drain",
        "fields_state",
        "handle",
        "incoming",
        "incoming_id",
        "incoming_settled",
        "name",
        "prefix",
        "refused",
        "remote_attached",
        "remote_handle",
        "role",
    )

    def __init__(self, channel: int, handle: int, name: str, role: bool) -> None:
        self.channel = channel
        self.handle = handle
        self.name = name
        self.role = role
        self.remote_handle: int | None = None
        self.remote_attached = False
        self.refused = False
        """The broker answered with a null terminus: its detach tells why."""
        self.detached = False
        """We sent our detach."""
        self.delivery_count = 0
        self.credit = 0
        """Sender: what the broker granted, less what we sent. Receiver: what we granted, less what arrived."""
        self.drain = False
        self.incoming: bytearray | None = None
        """The payload so far of a multi-frame delivery the broker is sending us."""
        self.incoming_id = 0
        self.incoming_settled = False
        handle_bytes = bytearray()
        codec.encode_into(handle_bytes, UInt(handle))
        # transfer performative of a one-frame delivery: descriptor, list8 header, handle, then the delivery id's
        # constructor; the delivery id, tag and the rest follow (``InnerClient.transfer``)
        size = len(handle_bytes) + 5 + 6 + 2  # + id, + tag, + message-format and settled
        self.prefix = TRANSFER_PREFIX + bytes((0xC0, size + 1, 5)) + bytes(handle_bytes) + bytes((_UINT32,))
        self.fields_state = bytes(handle_bytes) + bytes((_UINT32,))  # (the list header depends on the state's size)


class _Waiting:
    """A delivery waiting in its session's queue for credit or window, or (``control``) a detach of ``link`` or an
    end (``link`` None) waiting behind deliveries."""

    __slots__ = ("control", "frames", "link", "sent")

    def __init__(self, link: _Link | None, frames: list[bytes], *, control: bool = False) -> None:
        self.link = link
        self.frames = frames
        self.control = control
        self.sent = 0


class _Session:
    """Our end of one session."""

    __slots__ = (
        "channel",
        "ended",
        "incoming_window",
        "links",
        "next_delivery_id",
        "next_incoming_id",
        "next_outgoing_id",
        "remote_channel",
        "remote_incoming_window",
        "remote_links",
        "unsettled",
        "waiting",
    )

    def __init__(self, channel: int, window: int) -> None:
        self.channel = channel
        self.remote_channel: int | None = None
        self.next_outgoing_id = 0
        self.remote_incoming_window = 0
        """Transfer frames the broker takes before it opens its window again (0 until its begin came)."""
        self.next_incoming_id = 0
        self.incoming_window = window
        self.next_delivery_id = 0
        self.links: dict[int, _Link] = {}
        """By our handle, until both ends detached."""
        self.remote_links: dict[int, _Link] = {}
        """By the broker's handle."""
        self.unsettled: dict[int, _Link] = {}
        """Deliveries we sent unsettled that have no settled outcome yet: delivery id -> link."""
        self.waiting: deque[_Waiting] = deque()
        self.ended = False
        """We sent our end."""


class InnerClient:
    """A sans-IO AMQP 1.0 client for the gateway's inner connection (see the module docstring)."""

    def __init__(
        self,
        *,
        container_id: str = "amqp091-gateway",
        max_frame_size: int | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        """``max_frame_size``: what our open announces (None: no limit); the broker splits larger deliveries.
        ``window``: our session incoming window (§2.5.6), opened again once half used."""
        self.container_id = container_id
        self.max_frame_size = max_frame_size
        self.window = window
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        """The broker's max-frame-size (512 until its open came): our transfers are split to fit."""
        self._out = bytearray()
        self._in = bytearray()
        self._header_next = True
        self._sasl_failed = False
        self._close_requested = False
        self._close_sent = False
        self.closed = False
        """The connection is over (closed both ways, or SASL refused)."""
        self._sessions: dict[int, _Session] = {}
        self._remote_sessions: dict[int, _Session] = {}
        self._names = 0
        self._txn_state: tuple[bytes, bytes] = (b"", b"")  # the last txn-id and its encoded transactional-state

    # -- bytes ------------------------------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Every byte queued for the inner engine (``inner.receive_events(data, now)``)."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        return data

    @property
    def has_output(self) -> bool:
        """True when ``data_to_send`` would return something."""
        return bool(self._out)

    def _frame(self, channel: int, performative: Any, frame_type: int = AMQP_FRAME) -> None:
        self._out += encode_frame(channel, performative, b"", frame_type)

    # -- connection ---------------------------------------------------------------------------------------------
    def start(self, hostname: str | None, user: str | None, password: str | None) -> None:
        """SASL (PLAIN with ``user``, else ANONYMOUS), then the AMQP header and our ``open`` naming ``hostname``
        (the namespace), all pipelined (Part 5 §5.3.2: the engine reads them in order)."""
        self.sasl(user, password)
        self.open(hostname)

    def sasl(self, user: str | None, password: str | None) -> None:
        """The SASL header and our init: PLAIN with ``user``, else ANONYMOUS (Part 5 §5.3.3.2)."""
        if user is None:
            init = SaslInit(mechanism=Symbol("ANONYMOUS"), initial_response=b"")
        else:  # RFC 4616: authzid NUL authcid NUL passwd
            response = b"\x00" + user.encode() + b"\x00" + (password or "").encode()
            init = SaslInit(mechanism=Symbol("PLAIN"), initial_response=response)
        self._out += SASL_HEADER
        self._frame(0, init, SASL_FRAME)

    def open(self, hostname: str | None) -> None:
        """The AMQP header and our ``open`` naming ``hostname`` (the namespace; §2.7.1), after ``sasl``."""
        self._out += AMQP_HEADER
        max_frame = UInt(self.max_frame_size) if self.max_frame_size is not None else None
        self._frame(0, Open(container_id=self.container_id, hostname=hostname, max_frame_size=max_frame))

    def close(self) -> None:
        """Our ``close`` (§2.7.9), once what waits in the sessions went (a 0-9-1 client's publishes before its
        connection.close are not lost); ``Closed`` follows with the broker's."""
        if self._close_requested or self.closed:
            return
        self._close_requested = True
        self._close_when_sent()

    def _close_when_sent(self) -> None:
        if self._close_sent or any(session.waiting for session in self._sessions.values()):
            return
        self._close_sent = True
        self._frame(0, Close())

    # -- sessions -----------------------------------------------------------------------------------------------
    def begin(self, channel: int) -> None:
        """Begin a session on our ``channel`` (§2.7.2) with a huge incoming window."""
        if channel in self._sessions:
            raise LocalProtocolError(f"channel {channel} already has a session")
        self._sessions[channel] = _Session(channel, self.window)
        self._frame(
            channel,
            Begin(next_outgoing_id=UInt(0), incoming_window=UInt(self.window), outgoing_window=UInt(MASK)),
        )

    def end(self, channel: int) -> None:
        """End the session on ``channel`` (§2.7.8) after what waits in it; ``Ended`` follows with the broker's end.
        Ending it again is nothing."""
        session = self._sessions.get(channel)
        if session is None:
            raise LocalProtocolError(f"no session on channel {channel}")
        if session.ended:
            return
        session.ended = True
        self._after_waiting(session, None, encode_frame(channel, End()))

    def _after_waiting(self, session: _Session, link: _Link | None, frame: bytes) -> None:
        """Send ``frame`` (a detach of ``link``, or an end) after what waits in the session, so nothing the
        gateway sent before it is lost."""
        if session.waiting:
            session.waiting.append(_Waiting(link, [frame], control=True))
        else:
            self._out += frame

    def _session(self, channel: int) -> _Session:
        """Our session on ``channel``, which we have not ended (§2.7.8: nothing of it may follow our end)."""
        session = self._sessions.get(channel)
        if session is None or session.ended:
            raise LocalProtocolError(f"no session on channel {channel}")
        return session

    def _link(self, channel: int, handle: int) -> tuple[_Session, _Link]:
        session = self._session(channel)
        link = session.links.get(handle)
        if link is None or link.detached:
            raise LocalProtocolError(f"no link with handle {handle} on channel {channel}")
        return session, link

    # -- links --------------------------------------------------------------------------------------------------
    def _attach(self, channel: int, role: bool, name: str | None, **fields: Any) -> int:
        session = self._session(channel)
        handle = 0
        while handle in session.links:
            handle += 1
        if name is None:
            self._names += 1
            name = f"{self.container_id}:{channel}:{handle}:{self._names}"
        session.links[handle] = _Link(channel, handle, name, role)
        self._frame(channel, Attach(name=name, handle=UInt(handle), role=role, **fields))
        return handle

    def attach_sender(self, channel: int, *, target: str | None, name: str | None = None) -> int:
        """A link on which we send to ``target`` (None: the anonymous relay, messages carry ``to``); our handle.
        Its settle mode is mixed: each transfer says whether it is settled."""
        return self._attach(
            channel,
            SENDER,
            name,
            source=Source(),
            target=Target(address=target),
            initial_delivery_count=UInt(0),
        )

    def attach_receiver(
        self,
        channel: int,
        *,
        source: str,
        settled: bool,
        properties: dict[str, Any] | None = None,
        name: str | None = None,
        default_outcome: DeliveryState | None = None,
    ) -> int:
        """A link on which the broker sends us what ``source`` holds, settled (snd-settle-mode settled, §2.8.2:
        0-9-1 no-ack) or not; ``properties`` are the attach's link properties (``rabbitmq:exclusive``...);
        ``default_outcome`` is the source's (§3.5.3: what the broker does with what we leave unsettled when the
        link, session or connection ends). No credit until ``flow``."""
        props = {Symbol(key): value for key, value in properties.items()} if properties else None
        return self._attach(
            channel,
            RECEIVER,
            name,
            snd_settle_mode=UByte(1 if settled else 0),
            rcv_settle_mode=UByte(0),
            source=Source(address=source, default_outcome=default_outcome),
            target=Target(),
            properties=props,
        )

    def attach_coordinator(self, channel: int, *, name: str | None = None) -> int:
        """A transaction controller's link to the coordinator (Part 4 §4.3), asking for local transactions and
        hearing errors as rejected outcomes."""
        return self._attach(
            channel,
            SENDER,
            name,
            source=Source(outcomes=list(_OUTCOMES)),
            target=Coordinator(capabilities=[TXN_CAPABILITY]),
            initial_delivery_count=UInt(0),
        )

    def detach(self, channel: int, handle: int) -> None:
        """Detach (closing) our link (§2.7.7) after what waits in its session; ``Detached`` follows with the
        broker's detach. Outcomes of what we sent on it still come until then."""
        session, link = self._link(channel, handle)
        link.detached = True
        self._after_waiting(session, link, encode_frame(channel, Detach(handle=UInt(handle), closed=True)))

    # -- sending ------------------------------------------------------------------------------------------------
    def transfer(self, channel: int, handle: int, payload: bytes, *, settled: bool, txn_id: bytes | None = None) -> int:
        """Send one message on our sender link (§2.7.5), in a transactional-state naming ``txn_id`` when given
        (Part 4 §4.4.1); its delivery id. It waits for credit and window behind earlier ones of the session."""
        session, link = self._link(channel, handle)
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & MASK
        if not settled:
            session.unsettled[delivery_id] = link
        if txn_id is None:
            head = link.prefix + _ID_TAG.pack(delivery_id, _VBIN8, 4, delivery_id)
            head += _TAIL_SETTLED if settled else _TAIL_UNSETTLED
        else:
            head = self._transactional_head(link, delivery_id, settled, txn_id)
        size = 8 + len(head) + len(payload)
        if size <= self.remote_max_frame_size:
            if not session.waiting and link.credit > 0 and session.remote_incoming_window > 0:
                # the common case: straight out, nothing built but the header
                link.credit -= 1
                link.delivery_count = (link.delivery_count + 1) & MASK
                session.remote_incoming_window -= 1
                session.next_outgoing_id = (session.next_outgoing_id + 1) & MASK
                out = self._out
                out += FRAME_HEADER.pack(size, 2, AMQP_FRAME, channel)
                out += head
                out += payload
                return delivery_id
            frames = [FRAME_HEADER.pack(size, 2, AMQP_FRAME, channel) + head + payload]
        else:
            frames = self._split(channel, link, delivery_id, payload, settled, txn_id)
        session.waiting.append(_Waiting(link, frames))
        self._pump(session)
        return delivery_id

    def _transactional_head(self, link: _Link, delivery_id: int, settled: bool, txn_id: bytes) -> bytes:
        """The transfer performative of a one-frame transactional post, the state encoded once per txn-id."""
        if self._txn_state[0] != txn_id:
            self._txn_state = (txn_id, codec.encode(TransactionalState(txn_id=txn_id)))
        state = self._txn_state[1]
        fields = (
            link.fields_state
            + _ID_TAG.pack(delivery_id, _VBIN8, 4, delivery_id)
            + (_TAIL_SETTLED if settled else _TAIL_UNSETTLED)
            + _NOT_MORE
            + state
        )
        if len(fields) + 1 < 256:
            return TRANSFER_PREFIX + bytes((0xC0, len(fields) + 1, 8)) + fields
        return TRANSFER_PREFIX + struct.pack(">BII", 0xD0, len(fields) + 4, 8) + fields

    def _split(
        self, channel: int, link: _Link, delivery_id: int, payload: bytes, settled: bool, txn_id: bytes | None
    ) -> list[bytes]:
        """The frames of a delivery larger than the broker's max-frame-size (§2.6.14: more=true on all but the
        last; the first names the delivery)."""
        tag = delivery_id.to_bytes(4, "big")
        state: DeliveryState | None = TransactionalState(txn_id=txn_id) if txn_id is not None else None
        frames = []
        offset = 0
        first = True
        while first or offset < len(payload):
            head = (
                encode_transfer(link.handle, delivery_id, tag, 0, settled, True, state)
                if first
                else encode_transfer(link.handle, None, None, None, None, True)
            )
            room = self.remote_max_frame_size - 8 - len(head)
            chunk = payload[offset : offset + room]
            offset += len(chunk)
            if offset >= len(payload):  # the last frame: more=false
                head = (
                    encode_transfer(link.handle, delivery_id, tag, 0, settled, False, state)
                    if first
                    else encode_transfer(link.handle, None, None, None, None, False)
                )
            frames.append(FRAME_HEADER.pack(8 + len(head) + len(chunk), 2, AMQP_FRAME, channel) + head + chunk)
            first = False
        return frames

    def _pump(self, session: _Session) -> None:
        """Send what waits, in order, as far as credit (a delivery's first frame) and the broker's window (every
        frame, §2.5.6) allow."""
        waiting = session.waiting
        out = self._out
        while waiting:
            item = waiting[0]
            link = item.link
            if item.control:  # a detach or an end, behind what came before it
                out += item.frames[0]
                waiting.popleft()
                continue
            assert link is not None
            if session.remote_incoming_window <= 0:
                return
            if item.sent == 0:
                if link.credit <= 0:
                    return
                link.credit -= 1
                link.delivery_count = (link.delivery_count + 1) & MASK
            frames = item.frames
            while item.sent < len(frames) and session.remote_incoming_window > 0:
                out += frames[item.sent]
                item.sent += 1
                session.remote_incoming_window -= 1
                session.next_outgoing_id = (session.next_outgoing_id + 1) & MASK
            if item.sent < len(frames):
                return
            waiting.popleft()
        if self._close_requested:
            self._close_when_sent()

    def declare(self, channel: int, handle: int) -> int:
        """Ask the coordinator for a transaction (Part 4 §4.4.1); its ``Outcome`` carries ``declared``."""
        return self.transfer(channel, handle, _DECLARE, settled=False)

    def discharge(self, channel: int, handle: int, txn_id: bytes, fail: bool) -> int:
        """Commit (``fail`` false) or roll back the transaction (Part 4 §4.4.4); its ``Outcome`` tells how it
        went (accepted, or rejected with the reason)."""
        body = codec.encode(AmqpValue(Discharge(txn_id=txn_id, fail=fail)))
        return self.transfer(channel, handle, body, settled=False)

    def flow(self, channel: int, handle: int, credit: int, *, drain: bool = False) -> None:
        """Set the link-credit of our receiver link to ``credit`` from the deliveries counted so far (§2.6.7);
        with ``drain`` the broker uses it up or sends it back (a ``Credit`` with drain)."""
        session, link = self._link(channel, handle)
        link.credit = credit
        link.drain = drain
        self._send_flow(session, link)

    def holding(self, channel: int) -> bool:
        """Whether deliveries (or a detach or end behind them) of the session on ``channel`` still wait for credit
        or window: what was sent on it after them has not reached the broker either."""
        session = self._sessions.get(channel)
        return session is not None and bool(session.waiting)

    def held_size(self) -> int:
        """Bytes of frames waiting in the sessions for credit or window (O(frames waiting): for rare checks)."""
        return sum(
            len(frame)
            for session in self._sessions.values()
            for item in session.waiting
            for frame in item.frames[item.sent :]
        )

    def credit(self, channel: int, handle: int) -> int:
        """The link-credit of our link as we count it (§2.6.7): where we send, what the broker granted less what
        went out; where we receive, what we granted less what arrived."""
        return max(0, self._link(channel, handle)[1].credit)

    def _send_flow(self, session: _Session, link: _Link | None) -> None:
        fields: dict[str, Any] = {}
        if link is not None:
            fields["handle"] = UInt(link.handle)
            # §2.7.4: a receiver that has not seen the sender's attach leaves delivery-count null
            if link.role == SENDER or link.remote_attached:
                fields["delivery_count"] = UInt(link.delivery_count)
            fields["link_credit"] = UInt(max(0, link.credit))
            fields["drain"] = link.drain
        self._frame(
            session.channel,
            Flow(
                next_incoming_id=UInt(session.next_incoming_id) if session.remote_channel is not None else None,
                incoming_window=UInt(session.incoming_window),
                next_outgoing_id=UInt(session.next_outgoing_id),
                outgoing_window=UInt(MASK),
                **fields,
            ),
        )

    def settle(self, channel: int, first: int, last: int, state: DeliveryState, *, settled: bool = True) -> None:
        """Our disposition, as receiver, of the deliveries ``first``..``last`` the broker sent on ``channel``
        (§2.7.6): an outcome, or a transactional-state (Part 4 §4.4.2)."""
        session = self._session(channel)
        self._frame(
            session.channel,
            Disposition(
                role=RECEIVER,
                first=UInt(first),
                last=UInt(last) if last != first else None,
                settled=settled,
                state=state,
            ),
        )

    # -- receiving ----------------------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[InnerEvent]:
        """What the inner engine wrote (``inner.data_to_send()``); the events it carries."""
        events: list[InnerEvent] = []
        if self.closed or self._sasl_failed:
            return events
        buf = self._in
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 8:
                if self._header_next:
                    header = bytes(buf[pos : pos + 8])
                    if header not in (SASL_HEADER, AMQP_HEADER):
                        raise InnerProtocolError(f"unexpected protocol header {header!r}")
                    self._header_next = False
                    pos += 8
                    continue
                size, doff, _type, channel = FRAME_HEADER.unpack_from(buf, pos)
                if size < 8 or doff < 2 or doff * 4 > size:
                    raise InnerProtocolError(f"malformed frame header: size {size}, doff {doff}")
                if len(buf) - pos < size:
                    break
                body = bytes(buf[pos + doff * 4 : pos + size])
                pos += size
                if not body:
                    continue  # a heartbeat (§2.4.5)
                try:
                    performative, end = decode_performative(body)
                except DecodeError as exc:
                    raise InnerProtocolError(f"frame body does not decode: {exc}") from None
                self._received(channel, performative, body[end:] if end < len(body) else b"", events)
                if self._sasl_failed or self.closed:
                    break
        finally:
            del buf[:pos]
        return events

    def _received(self, channel: int, perf: Any, payload: bytes, events: list[InnerEvent]) -> None:
        kind = type(perf)
        if kind is Transfer:
            self._on_transfer(channel, perf, payload, events)
        elif kind is Disposition:
            self._on_disposition(channel, perf, events)
        elif kind is Flow:
            self._on_flow(channel, perf, events)
        elif kind is Attach:
            self._on_attach(channel, perf, events)
        elif kind is Detach:
            self._on_detach(channel, perf, events)
        elif kind is Begin:
            self._on_begin(channel, perf)
        elif kind is End:
            self._on_end(channel, perf, events)
        elif kind is Open:
            if perf.max_frame_size is not None:
                self.remote_max_frame_size = max(MIN_MAX_FRAME_SIZE, int(perf.max_frame_size))
            else:
                self.remote_max_frame_size = MASK
            events.append(Opened())
        elif kind is Close:
            if not self._close_sent:  # (what waits is dropped: the connection is over)
                self._close_sent = True
                self._frame(0, Close())
            self.closed = True
            events.append(Closed(perf.error))
        elif kind is SaslOutcome:
            ok = perf.code == 0
            self._header_next = ok
            self._sasl_failed = not ok
            if not ok:
                self.closed = True
            events.append(SaslDone(ok))
        # sasl-mechanisms: ours was chosen already (pipelined)

    def _remote_session(self, channel: int) -> _Session:
        session = self._remote_sessions.get(channel)
        if session is None:
            raise InnerProtocolError(f"a frame on the broker's channel {channel}, where no session of ours is")
        return session

    def _on_begin(self, channel: int, begin: Begin) -> None:
        ours = begin.remote_channel
        session = self._sessions.get(int(ours)) if ours is not None else None
        if session is None:
            raise InnerProtocolError(f"a begin answering channel {ours}, where we began no session")
        session.remote_channel = channel
        session.next_incoming_id = int(begin.next_outgoing_id or 0)
        # §2.5.6: its window counts from our first transfer id (0)
        session.remote_incoming_window = int(begin.incoming_window or 0) - session.next_outgoing_id
        self._remote_sessions[channel] = session
        self._pump(session)

    def _on_end(self, channel: int, end: End, events: list[InnerEvent]) -> None:
        session = self._remote_session(channel)
        del self._remote_sessions[channel]
        # what waits is dropped, and our end, if it waits, goes now as the answer
        queued_end = any(w.control and w.link is None for w in session.waiting)
        session.waiting.clear()
        if not session.ended or queued_end:
            session.ended = True
            self._frame(session.channel, End())
        del self._sessions[session.channel]
        events.append(Ended(session.channel, end.error))

    def _on_attach(self, channel: int, attach: Attach, events: list[InnerEvent]) -> None:
        session = self._remote_session(channel)
        role = not attach.role
        link = next(
            (k for k in session.links.values() if k.name == attach.name and k.role == role and k.remote_handle is None),
            None,
        )
        if link is None:
            raise InnerProtocolError(f"an attach of {attach.name!r}, which is no link of ours")
        link.remote_handle = int(attach.handle or 0)
        link.remote_attached = True
        session.remote_links[link.remote_handle] = link
        terminus = attach.target if role == SENDER else attach.source
        link.refused = terminus is None  # §2.6.3: a null terminus, then a detach with the reason
        if role == RECEIVER:
            link.delivery_count = int(attach.initial_delivery_count or 0)
        if not link.refused:  # (a refusal's Attached waits for the detach that says why)
            events.append(Attached(link.channel, link.handle))

    def _on_detach(self, channel: int, detach: Detach, events: list[InnerEvent]) -> None:
        session = self._remote_session(channel)
        link = session.remote_links.pop(int(detach.handle or 0), None)
        if link is None:
            raise InnerProtocolError(f"a detach of the broker's handle {detach.handle}, which names no link of ours")
        # what waits on the link is dropped, and our detach, if it waits, goes now as the answer (before the handle
        # can be used again)
        queued_detach = any(w.control and w.link is link for w in session.waiting)
        if any(w.link is link for w in session.waiting):
            session.waiting = deque(w for w in session.waiting if w.link is not link)
        if not link.detached or queued_detach:
            link.detached = True
            self._frame(session.channel, Detach(handle=UInt(link.handle), closed=True))
        for delivery_id in [d for d, owner in session.unsettled.items() if owner is link]:
            del session.unsettled[delivery_id]
        del session.links[link.handle]
        if link.refused:
            events.append(Attached(link.channel, link.handle, detach.error))
        else:
            events.append(Detached(link.channel, link.handle, detach.error))

    def _on_flow(self, channel: int, flow: Flow, events: list[InnerEvent]) -> None:
        session = self._remote_session(channel)
        # §2.5.6: remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id
        start = 0 if flow.next_incoming_id is None else int(flow.next_incoming_id)
        window = (start + int(flow.incoming_window or 0) - session.next_outgoing_id) & MASK
        session.remote_incoming_window = 0 if window > 0x7FFFFFFF else window
        link = session.remote_links.get(int(flow.handle)) if flow.handle is not None else None
        if link is None:
            self._pump(session)
            if flow.echo:
                self._send_flow(session, None)
            return
        drain = bool(flow.drain)
        if link.role == SENDER:
            # §2.6.7: link-credit(snd) := delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
            count = link.delivery_count if flow.delivery_count is None else int(flow.delivery_count)
            credit = (count + int(flow.link_credit or 0) - link.delivery_count) & MASK
            link.credit = 0 if credit > 0x7FFFFFFF else credit
            link.drain = drain
            self._pump(session)
            if drain and link.credit > 0 and not any(w.link is link for w in session.waiting):
                # §2.6.7: a drained sender with nothing to send uses its credit up, and says so
                link.delivery_count = (link.delivery_count + link.credit) & MASK
                link.credit = 0
                self._send_flow(session, link)
            elif flow.echo:
                self._send_flow(session, link)
        else:
            if flow.delivery_count is not None:  # the sender advanced it (a drain) past what arrived
                advanced = ((int(flow.delivery_count) - link.delivery_count + 0x80000000) & MASK) - 0x80000000
                link.credit -= advanced
                link.delivery_count = int(flow.delivery_count)
            if drain:
                link.drain = False  # the drain came back
            self._pump(session)
            if flow.echo:
                self._send_flow(session, link)
        if not link.detached:  # (a link we detached still sends what waits for its credit, but says nothing)
            events.append(Credit(link.channel, link.handle, max(0, link.credit), drain))

    def _on_transfer(self, channel: int, transfer: Transfer, payload: bytes, events: list[InnerEvent]) -> None:
        session = self._remote_session(channel)
        session.next_incoming_id = (session.next_incoming_id + 1) & MASK
        session.incoming_window -= 1
        if session.incoming_window < self.window // 2:
            session.incoming_window = self.window
            self._send_flow(session, None)
        link = session.remote_links.get(int(transfer.handle or 0))
        if link is None or link.detached:
            return  # §2.6.2: sent before the broker saw our detach
        partial = link.incoming
        if partial is None:
            link.delivery_count = (link.delivery_count + 1) & MASK
            link.credit -= 1
        if transfer.aborted:
            link.incoming = None  # §2.6.14: an aborted delivery is discarded
            return
        if transfer.more:
            if partial is None:
                link.incoming = bytearray(payload)
                link.incoming_id = int(transfer.delivery_id or 0)
                link.incoming_settled = bool(transfer.settled)
            else:
                partial += payload
                link.incoming_settled = link.incoming_settled or bool(transfer.settled)
            return
        if partial is None:  # the usual case: a whole message in one frame
            delivery_id = int(transfer.delivery_id or 0)
            events.append(Delivered(link.channel, link.handle, delivery_id, payload, bool(transfer.settled)))
            return
        link.incoming = None
        partial += payload
        settled = link.incoming_settled or bool(transfer.settled)
        events.append(Delivered(link.channel, link.handle, link.incoming_id, bytes(partial), settled))

    def _on_disposition(self, channel: int, disposition: Disposition, events: list[InnerEvent]) -> None:
        if disposition.role != RECEIVER:
            return  # the broker settling what it sent us: nothing for the gateway to do
        session = self._remote_session(channel)
        unsettled = session.unsettled
        first = int(disposition.first or 0)
        span = 0 if disposition.last is None else (int(disposition.last) - first) & MASK
        settled = bool(disposition.settled)
        state = disposition.state
        if span < len(unsettled):
            ids = [(first + i) & MASK for i in range(span + 1)]
        else:
            ids = sorted((d for d in unsettled if (d - first) & MASK <= span), key=lambda d: (d - first) & MASK)
        for delivery_id in ids:
            link = unsettled.get(delivery_id)
            if link is None:
                continue
            if settled:
                del unsettled[delivery_id]
            events.append(Outcome(link.channel, link.handle, delivery_id, state, settled))


_DECLARE = codec.encode(AmqpValue(Declare()))


__all__ = [
    "Attached",
    "Closed",
    "Credit",
    "Delivered",
    "Detached",
    "Ended",
    "InnerClient",
    "InnerEvent",
    "InnerProtocolError",
    "Opened",
    "Outcome",
    "SaslDone",
]
