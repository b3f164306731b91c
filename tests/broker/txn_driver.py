"""An in-memory AMQP client for driving the real broker core and engine without sockets or trio.

``World`` owns one ``Broker`` and any number of ``Peer``s. A peer is a thin client: it encodes frames with
``minibroker.testing.frames``, pushes them into its ``ServerConnection`` with ``receive_events``, hands the
resulting events to ``Broker.handle`` exactly as the trio layer does, then drains the output of *every*
connection (a commit on one connection can dispatch to consumers of another) and decodes it. Time passes
only when the test says so (``World.advance``, which calls ``Broker.handle_timeout``).

What a peer learns from the broker's frames is collected in ``Observed``: deliveries its consumers started
to receive (first frame), completed (last frame) or saw aborted, the broker settling deliveries it sent
(disposition role=sender), the broker's answers to the peer's own transfers (disposition role=receiver:
provisional outcomes, ``declared``), the broker's attach replies (the address of a dynamic node), links the
broker detached on its own initiative, and ``violations``: frames a correct peer of the protocol can never
receive (a transfer beyond the session window or on a link that is gone, a continuation with no delivery
in progress, a disposition for a delivery the peer already settled or has not completely received). The
peer keeps only the bookkeeping the protocol needs (handles, delivery ids, session window, which of its
received deliveries are still unsettled); deciding what *should* have happened is the test's model.

Messages carry their name in their body as ``<<name>>`` (``payload()``), so a peer can tell which message
a multi-frame delivery carries from its first frame, and a test can read names back from ``peek()``.

``BrokerView`` reads the broker only through the public inspection API (``minibroker.handles``); ``census``
turns it into what every queue holds. ``World.event_filter``, ``lose_second_transactional_post`` and
``deliver_redeliveries_twice`` inject faults at the engine boundary, to prove that a checker can fail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Close,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    Error,
    Flow,
    Header,
    Properties,
    Source,
    Target,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import Broker
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import Event, TransferReceived
from minibroker.handles import NamespaceView
from minibroker.testing import frames
from minibroker.testing.client import ClientConnection, Delivery, Ended, Frame, ProtocolHeader, Session

TXN_ID = Symbol("txn-id")
WINDOW = 1 << 20  # session window of a peer that never holds the broker back
ACCEPTED_LIST = Symbol("amqp:accepted:list")
REJECTED_LIST = Symbol("amqp:rejected:list")
BIG = 1200  # characters of padding in a "big" message: several frames at max-frame-size 512

_MARK = re.compile(rb"<<([^<>]{1,64})>>")
_MARK_TEXT = re.compile(r"<<([^<>]{1,64})>>")


def payload(name: str, *, big: bool = False, to: str | None = None) -> bytes:
    """An encoded message named ``name`` (amqp-value body ``<<name>>`` plus padding when ``big``)."""
    sections = [Properties(to=to)] if to is not None else []
    return frames.message(f"<<{name}>>" + ("." * BIG if big else ""), *sections)


def name_in(data: bytes | str | Any) -> str | None:
    """The message name in (the start of) an encoded message, or in a decoded body."""
    if isinstance(data, bytes | bytearray):
        found = _MARK.search(data)
        return found.group(1).decode() if found else None
    if isinstance(data, str):
        text = _MARK_TEXT.search(data)
        return text.group(1) if text else None
    return None


def discharge_with_uint_fail(txn_id: bytes) -> bytes:
    """A coordinator message whose discharge carries ``fail`` as a uint 1 instead of a boolean (D2)."""
    fields = codec.encode(txn_id) + b"\x52\x01"  # smalluint 1
    discharge = b"\x00\x53\x32\xc0" + bytes([len(fields) + 1, 2]) + fields  # amqp:discharge:list, list8
    return b"\x00\x53\x77" + discharge  # in an amqp-value section


def decode_message(data: bytes) -> tuple[Any, int]:
    """``(body, delivery_count)`` of an encoded message whose body is an amqp-value."""
    body: Any = None
    count = 0
    for section in codec.decode_all(data):
        if isinstance(section, Header):
            count = section.delivery_count or 0
        elif isinstance(section, AmqpValue):
            body = section.value
    return body, count


@dataclass
class Started:
    """The first frame of a delivery the broker sent on one of our consumer links."""

    link: str
    delivery_id: int
    settled: bool
    state: Any
    name: str | None


@dataclass
class Completed:
    """The last frame of a delivery arrived: the whole message."""

    link: str
    delivery_id: int
    name: str | None
    delivery_count: int
    payload: bytes = b""
    """The whole encoded message."""


@dataclass
class Observed:
    """Everything one peer saw in answer to one step."""

    started: list[Started] = field(default_factory=list)
    completed: list[Completed] = field(default_factory=list)
    aborted: list[tuple[str, int]] = field(default_factory=list)
    """(link, delivery id) of deliveries the broker aborted (transfer aborted=true)."""
    settled_by_broker: list[tuple[int, Any]] = field(default_factory=list)
    """(delivery id, state) of deliveries the broker sent us and has now settled."""
    updated: list[tuple[int, Any]] = field(default_factory=list)
    """(delivery id, state) of deliveries the broker sent us whose state it updated without settling them."""
    answers: dict[int, tuple[Any, bool]] = field(default_factory=dict)
    """Our delivery id -> (state, settled): the broker's disposition of what we sent."""
    attached: dict[str, Attach] = field(default_factory=dict)
    """The broker's attach, by link name."""
    detached: list[tuple[str, Error | None]] = field(default_factory=list)
    """Links the broker detached on its own initiative (not as the answer to our detach)."""
    violations: list[str] = field(default_factory=list)
    closed: bool = False
    performatives: list[Any] = field(default_factory=list)
    """Every performative the broker sent, in order (flows, dispositions, close: whatever a test must order)."""
    close_error: Error | None = None
    """The error of the broker's close, if it closed the connection with one."""


EventFilter = Callable[["Peer", list[Event]], list[Event]]


class Peer:
    """One client connection, one session (channel 0), driving the broker's engine in memory.

    The client side is the sans-IO client core (``client``, a ``ClientConnection``): it keeps the handles,
    delivery ids and counts, the session window, the deliveries in progress and the unsettled ones, and notes
    what a correct broker can never send. This class adds what the transaction tests observe (``Observed``).
    ``max_frame_size`` is what the peer's open announces (the broker splits larger deliveries); ``window``
    is the session incoming window it starts with. A peer with ``window=None`` never holds the broker back;
    otherwise it accepts transfer frames only up to ``window_limit`` (raised by ``open_window``).
    """

    def __init__(
        self,
        world: World,
        container_id: str,
        *,
        max_frame_size: int | None = None,
        window: int | None = None,
        hostname: str | None = None,
    ) -> None:
        self.world = world
        self.container_id = container_id
        self.max_frame_size = max_frame_size
        self.hostname = hostname
        """The hostname our open names (the broker's namespace of that name, if there is one)."""
        self.conn = ServerConnection()
        """The broker's end: the engine this peer feeds."""
        world.broker.connection_made(self.conn)
        self.client = ClientConnection()
        """Our end: the client core."""
        self.alive = True
        self.limited = window is not None
        self._window = WINDOW if window is None else window
        self._detaching: set[str] = set()
        """Links we detached whose detach the broker has not answered yet."""
        self._settled_by_us: set[int] = set()
        self._held: dict[int, tuple[str, str | None]] = {}
        """The model's own account of what we hold unsettled (to check the broker's settling against)."""
        self._next_handle = 0
        self.addresses: dict[str, str] = {}  # the address of the node each link is attached to (dynamic ones)
        self.observed = Observed()

    @property
    def session(self) -> Session:
        """Our session (channel 0) as the client core keeps it."""
        return self.client.session(0)

    # -- sending ------------------------------------------------------------------------------------
    def connect(self) -> None:
        fields: dict[str, Any] = {}
        if self.max_frame_size is not None:
            fields["max_frame_size"] = UInt(self.max_frame_size)
        if self.hostname is not None:
            fields["hostname"] = self.hostname
        self.client.send_header(AMQP_HEADER)
        self.client.send(frames.open_(self.container_id, **fields))
        self.client.send(frames.begin(incoming_window=self._window))
        self._feed()

    def send(self, performative: Any, data: bytes = b"") -> None:
        self.client.send(performative, 0, data)
        self._feed()

    def send_together(self, *items: tuple[Any, bytes]) -> None:
        """Several ``(performative, payload)`` frames that reach the broker in one read."""
        for performative, data in items:
            self.client.send(performative, 0, data)
        self._feed()

    def send_encoded(self, data: bytes, performative: Any) -> None:
        """One frame encoded by the caller (patched bytes, for a negative test); ``performative`` is what it says."""
        self.client.send_encoded(data, performative)
        self._feed()

    def _feed(self) -> None:
        assert self.alive, f"{self.container_id} is closed"
        world = self.world
        events = self.conn.receive_events(self.client.data_to_send(), world.now)
        if world.event_filter is not None:
            events = world.event_filter(self, events)
        world.broker.handle(self.conn, events, world.now)

    def eof(self) -> None:
        """The socket ends without a close frame."""
        self._feed()  # b"": the end of the stream
        self.alive = False

    def close(self) -> None:
        self.send(Close())
        self.alive = False

    # -- session window -----------------------------------------------------------------------------
    @property
    def frames_in(self) -> int:
        """Transfer frames the broker sent us."""
        return self.session.next_incoming_id

    @property
    def transfers_out(self) -> int:
        """Transfer frames we sent."""
        return self.session.next_outgoing_id

    @property
    def window_room(self) -> int:
        """Transfer frames the broker may still send us."""
        return max(0, self.session.incoming_window)

    @property
    def window_limit(self) -> int:
        """We accept transfer frames numbered below this (session next-incoming-id + incoming-window)."""
        return self.frames_in + self.window_room

    @property
    def receiving(self) -> bool:
        """True while some delivery to us has started and neither completed nor been aborted."""
        return any(link.receiving is not None for link in self.session.links.values())

    @property
    def unsettled(self) -> dict[int, tuple[str, str | None]]:
        """Deliveries we received completely and unsettled, that nobody has settled: id -> (link, name)."""
        return dict(self._held)

    def open_window(self, frames_more: int) -> None:
        """Let ``frames_more`` more transfer frames in (a session flow)."""
        self.send(self.client.flow(incoming_window=self.window_room + frames_more, outgoing_window=WINDOW))

    # -- links --------------------------------------------------------------------------------------
    def handle(self, name: str) -> int:
        """Our handle of the link called ``name``."""
        return self.session.link(name).handle

    def new_handle(self, name: str) -> int:
        """The handle a new link called ``name`` gets."""
        assert not self.attached(name), f"link {name} already attached"
        handle = self._next_handle  # never reused, so a late frame of an old link cannot pass for a new one's
        self._next_handle += 1
        return handle

    def attach_producer(self, name: str, address: str | None, *, dynamic: bool = False) -> None:
        """A sender link to ``address`` (None: the anonymous relay; ``dynamic``: a node made for the link)."""
        target = Target(dynamic=True) if dynamic else Target(address=address)
        self.send(frames.attach_sender(address, self.new_handle(name), name, target=target))

    def attach_controller(
        self,
        name: str,
        *,
        rejects: bool = True,
        snd_settle_mode: int | None = None,
        capabilities: tuple[str, ...] = (),
    ) -> None:
        """A coordinator link; its source offers rejected (errors come as rejected) or only accepted; its target
        asks for ``amqp:local-transactions`` and ``capabilities``."""
        outcomes = [ACCEPTED_LIST, REJECTED_LIST] if rejects else [ACCEPTED_LIST]
        target = Coordinator(capabilities=[Symbol(c) for c in ("amqp:local-transactions", *capabilities)])
        mode = None if snd_settle_mode is None else UInt(snd_settle_mode)
        attach = frames.attach_sender(
            None, self.new_handle(name), name, target=target, source=Source(outcomes=outcomes), snd_settle_mode=mode
        )
        self.send(attach)

    def attach_consumer(
        self,
        name: str,
        address: str | None,
        *,
        presettled: bool,
        default_outcome: Any,
        dynamic: bool = False,
        source_filter: dict[Any, Any] | None = None,
    ) -> None:
        source = Source(address=address, dynamic=dynamic or None, default_outcome=default_outcome, filter=source_filter)
        settle_mode = UInt(1) if presettled else None
        self.send(
            frames.attach_receiver(address, self.new_handle(name), name, source=source, snd_settle_mode=settle_mode)
        )

    def detach(self, name: str, *, closed: bool = True) -> None:
        handle = self.handle(name)
        self._detaching.add(name)
        self._forget(name)
        self.send(Detach(handle=UInt(handle), closed=closed))

    def _forget(self, name: str) -> None:
        """A detached link's deliveries are no longer ours to settle."""
        self._held = {d: v for d, v in self._held.items() if v[0] != name}

    def attached(self, name: str) -> bool:
        """True while the link called ``name`` is ours to use (attached, and not detached by us)."""
        try:
            return not self.session.link(name).detached
        except KeyError:
            return False

    # -- performatives ------------------------------------------------------------------------------
    def transfer(self, link: str, data: bytes, *, settled: bool = False, state: Any = None) -> int:
        """Send one message in one frame on ``link``; returns its delivery id."""
        delivery_id = self.client.next_delivery_id()
        self.send(frames.transfer(self.handle(link), delivery_id, settled=settled, state=state), data)
        return delivery_id

    def begin_transfer(self, link: str, data: bytes, *, settled: bool = False, state: Any = None) -> int:
        """The first frame of a multi-frame message (more=true); returns its delivery id."""
        assert not self.sending(link), f"{link} is already sending a message"
        delivery_id = self.client.next_delivery_id()
        self.send(frames.transfer(self.handle(link), delivery_id, settled=settled, state=state, more=True), data)
        return delivery_id

    def end_transfer(self, link: str, data: bytes, *, state: Any = None) -> int:
        """The last frame of the message ``link`` is sending (more=false); returns its delivery id."""
        delivery_id = self.session.link(link).sending
        assert delivery_id is not None, f"{link} is sending no message"
        self.send(frames.transfer(self.handle(link), None, state=state, more=False), data)
        return delivery_id

    def sending(self, link: str) -> bool:
        return self.attached(link) and self.session.link(link).sending is not None

    def control(self, controller: str, body: bytes, *, settled: bool = False, state: Any = None) -> int:
        """Send an encoded coordinator message (declare or discharge, perhaps malformed)."""
        return self.transfer(controller, body, settled=settled, state=state)

    def declare(self, controller: str, *, settled: bool = False, state: Any = None) -> int:
        return self.transfer(controller, frames.message(AmqpValue(Declare())), settled=settled, state=state)

    def declared(self, controller: str) -> bytes:
        """Declare a transaction on ``controller`` and let the world settle: its txn-id (the broker must declare it;
        what else the world saw meanwhile is dropped)."""
        delivery_id = self.declare(controller)
        answer = self.world.settle()[self].answers[delivery_id][0]
        assert isinstance(answer, Declared), answer
        return answer.txn_id

    def discharge(self, controller: str, txn_id: bytes, *, fail: bool, settled: bool = False) -> int:
        body = frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=fail)))
        return self.transfer(controller, body, settled=settled)

    def flow(self, link: str, credit: int, properties: dict[Any, Any] | None = None) -> None:
        """Grant ``credit`` on our receiving ``link`` (its delivery-count as we counted it, §2.6.7)."""
        self.send(self.flow_frame(link, credit, properties=properties))

    def flow_frame(self, link: str, credit: int, **fields: Any) -> Flow:
        """The ``flow`` that ``flow(link, credit)`` sends (session fields as this peer counted them)."""
        return self.client.flow(
            self.handle(link), credit, incoming_window=self.window_room, outgoing_window=WINDOW, **fields
        )

    def dispose(self, delivery_id: int, state: Any, *, settled: bool) -> None:
        """Our disposition (as receiver) of a delivery the broker sent."""
        if settled:
            self._held.pop(delivery_id, None)
            self._settled_by_us.add(delivery_id)
        self.send(frames.disposition(delivery_id, settled=settled, state=state))

    # -- receiving ----------------------------------------------------------------------------------
    def take_output(self) -> list[Any]:
        """Decode what the broker wrote; returns performatives the peer must answer (detach replies)."""
        client = self.client
        data = self.conn.data_to_send()
        if data:
            client.receive_data(data)
        replies: list[Any] = []
        while (event := client.next_event()) is not None and not isinstance(event, Ended):
            if isinstance(event, ProtocolHeader):
                assert event.data == AMQP_HEADER, event
            elif not event.is_heartbeat:
                self.on_frame(event, replies)
        self.observed.violations += [f"{self.container_id}: {v}" for v in client.violations]
        client.violations.clear()
        return replies

    def on_frame(self, frame: Frame, replies: list[Any]) -> None:
        """Note what one frame from the broker shows (after the client core has counted it)."""
        perf = frame.performative
        obs = self.observed
        obs.performatives.append(perf)
        if isinstance(perf, Attach):
            assert perf.name is not None
            obs.attached[perf.name] = perf
            terminus = perf.source if perf.role == frames.SENDER else perf.target
            address = getattr(terminus, "address", None)
            if isinstance(address, str):
                self.addresses[perf.name] = address
        elif isinstance(perf, Transfer) and frame.delivery is not None:
            self._on_delivery(frame.delivery, frame.payload)
        elif isinstance(perf, Disposition):
            first = perf.first or 0
            last = first if perf.last is None else perf.last
            for delivery_id in range(first, last + 1):
                if perf.role == frames.SENDER:  # the broker, as sender, settles what it sent us
                    self._on_settled(delivery_id, perf)
                else:
                    if delivery_id in obs.answers:
                        obs.violations.append(f"{self.container_id}: two answers for our delivery {delivery_id}")
                    obs.answers[delivery_id] = (perf.state, bool(perf.settled))
        elif isinstance(perf, Detach) and frame.link is not None:
            name = frame.link.name
            if name in self._detaching:
                self._detaching.discard(name)
            else:
                obs.detached.append((name, perf.error))
                self._forget(name)
                replies.append(Detach(handle=UInt(frame.link.handle), closed=True))
        elif isinstance(perf, Close):
            obs.closed = True
            obs.close_error = perf.error

    def _on_delivery(self, delivery: Delivery, first_payload: bytes) -> None:
        obs = self.observed
        name = delivery.link or "?"
        if name in self._detaching or not self.attached(name):
            obs.violations.append(f"{self.container_id}: transfer on {name}, which is no link of ours (any more)")
            return
        if delivery.frames == 1:
            obs.started.append(
                Started(name, delivery.delivery_id, delivery.settled, delivery.state, name_in(first_payload))
            )
        if not delivery.complete:
            return
        if delivery.aborted:
            obs.aborted.append((name, delivery.delivery_id))
            return
        body, count = decode_message(delivery.payload)
        obs.completed.append(Completed(name, delivery.delivery_id, name_in(body), count, bytes(delivery.payload)))
        if not delivery.settled:
            self._held[delivery.delivery_id] = (name, name_in(body))

    def _on_settled(self, delivery_id: int, perf: Disposition) -> None:
        obs = self.observed
        me = self.container_id
        if delivery_id in self._settled_by_us:
            obs.violations.append(f"{me}: the broker settled delivery {delivery_id}, which we had settled (D5)")
        elif delivery_id not in self._held:
            obs.violations.append(f"{me}: the broker settled delivery {delivery_id}, which we do not hold")
        elif not perf.settled:
            # §2.7.6 allows it; only a personality that answers transactional retirements at once does it
            if not self.world.broker.default.personality.retire_answered:
                obs.violations.append(f"{me}: broker disposition of its delivery {delivery_id} that does not settle")
            obs.updated.append((delivery_id, perf.state))
        else:
            obs.settled_by_broker.append((delivery_id, perf.state))
            del self._held[delivery_id]


class World:
    """One broker and its in-memory peers, on a clock that moves only when told."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.peers: list[Peer] = []
        self.now = 0.0
        self.event_filter: EventFilter | None = None
        """Test-only seam: rewrites a batch of engine events before ``Broker.handle`` sees it."""

    def connect(
        self,
        container_id: str,
        *,
        max_frame_size: int | None = None,
        window: int | None = None,
        hostname: str | None = None,
    ) -> Peer:
        peer = Peer(self, container_id, max_frame_size=max_frame_size, window=window, hostname=hostname)
        self.peers.append(peer)
        peer.connect()
        return peer

    def advance(self, seconds: float) -> None:
        """The clock moves; the broker runs its timers (transaction time-outs)."""
        self.now += seconds
        self.broker.handle_timeout(self.now)

    def settle(self) -> dict[Peer, Observed]:
        """Drain every connection's output (answering broker-initiated detaches); what each peer saw."""
        for peer in self.peers:
            peer.observed = Observed()
        while True:
            replies = [(peer, peer.take_output()) for peer in self.peers]
            pending = [(peer, r) for peer, rs in replies for r in rs if peer.alive]
            if not pending:
                break
            for peer, reply in pending:
                peer.send(reply)
        seen = {peer: peer.observed for peer in self.peers}
        self.peers = [peer for peer in self.peers if peer.alive]
        return seen


# -- faults for proving that a checker can fail (engine boundary only: the broker core is left alone) -------------
def lose_second_transactional_post() -> EventFilter:
    """An event filter under which the second transactional post of every transaction never reaches the broker
    core, while its client still gets the provisional ``transactional-state(accepted)`` the core would have
    given (§4.4.1). A commit then applies the rest: seen from outside, a partial commit."""
    seen: dict[Any, int] = {}

    def lose(peer: Peer, events: list[Event]) -> list[Event]:
        kept: list[Event] = []
        for e in events:
            state = e.delivery.state if isinstance(e, TransferReceived) else None
            if isinstance(state, TransactionalState) and not isinstance(e.link.target, Coordinator):
                seen[state.txn_id] = seen.get(state.txn_id, 0) + 1
                if seen[state.txn_id] == 2:
                    accepted = TransactionalState(txn_id=state.txn_id, outcome=Accepted())
                    peer.conn.dispose_incoming([e.delivery], accepted)
                    continue
            kept.append(e)
        return kept

    return lose


def deliver_redeliveries_twice(original: Callable[..., Any]) -> Callable[..., Any]:
    """A replacement for ``ServerConnection.deliver`` that sends a message it has sent before (a redelivery)
    twice: a released message reaches a consumer on two deliveries at once."""
    sent: set[str | None] = set()

    def deliver(self: ServerConnection, link: Any, data: bytes, **fields: Any) -> Any:
        delivery = original(self, link, data, **fields)
        name = name_in(data)
        if name in sent and link.credit > 0:  # (a duplicate with no credit for it would be refused)
            original(self, link, data, **fields)
        sent.add(name)
        return delivery

    return deliver


class BrokerView(NamespaceView):
    """The broker's default namespace through the public inspection handles (peek, stats, transactions)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def _call(self, fn: Callable[[Broker], Any]) -> Any:
        return fn(self.world.broker)

    def _now(self) -> float:
        return self.world.now


@dataclass(frozen=True)
class QueueCensus:
    """One queue as the inspection API shows it: ready messages in order, and counts."""

    ready: tuple[tuple[str | None, int], ...]
    """(name, delivery-count) of each ready message, in delivery order."""
    acquired: int
    staged: int


def census(view: BrokerView) -> dict[str, QueueCensus]:
    """Every queue of the namespace, read through ``peek()`` and ``stats()``."""
    found: dict[str, QueueCensus] = {}
    for name in view.queues:
        handle = view.queue(name)
        stats = handle.stats()
        ready = tuple((name_in(m.body), m.delivery_count) for m in handle.peek())
        found[name] = QueueCensus(ready, stats.acquired, stats.staged)
    return found


__all__ = [
    "BIG",
    "TXN_ID",
    "BrokerView",
    "Completed",
    "Observed",
    "Peer",
    "QueueCensus",
    "Started",
    "World",
    "census",
    "decode_message",
    "deliver_redeliveries_twice",
    "discharge_with_uint_fail",
    "lose_second_transactional_post",
    "name_in",
    "payload",
]
