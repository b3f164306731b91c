"""An in-memory AMQP client for driving the real broker core and engine without sockets or trio.

``World`` owns one ``Broker`` and any number of ``Peer``s. A peer is a thin client: it encodes frames with
``minibroker.testing.frames``, pushes them into its ``ServerConnection`` with ``receive_data``, hands the
resulting events to ``Broker.handle`` exactly as the trio layer does, then drains the output of *every*
connection (a commit on one connection can dispatch to consumers of another) and decodes it.

What a peer learns from the broker's frames is collected in ``Observed``: transfers received by its
consumers, the broker settling deliveries it sent (disposition role=sender), the broker's answers to the
peer's own transfers (disposition role=receiver: provisional outcomes, ``declared``), and links the broker
detached on its own initiative. The peer keeps only the bookkeeping the protocol needs (handles, delivery
ids, session counters, which of its received deliveries are still unsettled); deciding what *should* have
happened is the test's model, not this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    Attach,
    Close,
    Coordinator,
    Declare,
    Detach,
    Discharge,
    Disposition,
    Error,
    Flow,
    Header,
    Source,
    Transfer,
)
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import Broker
from minibroker.broker.links import Consumer, Dispatched
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link
from minibroker.testing import frames

TXN_ID = Symbol("txn-id")
WINDOW = 2048


def decode_message(payload: bytes) -> tuple[Any, int]:
    """``(body, delivery_count)`` of an encoded message whose body is an amqp-value."""
    body: Any = None
    count = 0
    for section in codec.decode_all(payload):
        if isinstance(section, Header):
            count = section.delivery_count or 0
        elif isinstance(section, AmqpValue):
            body = section.value
    return body, count


@dataclass
class Transferred:
    """A message the broker sent on one of our consumer links."""

    link: str
    delivery_id: int
    settled: bool
    state: Any
    body: Any
    delivery_count: int


@dataclass
class Observed:
    """Everything one peer saw in answer to one step."""

    transfers: list[Transferred] = field(default_factory=list)
    settled_by_broker: list[tuple[int, Any]] = field(default_factory=list)
    """(delivery id, state) of deliveries the broker sent us and has now settled."""
    answers: dict[int, tuple[Any, bool]] = field(default_factory=dict)
    """Our delivery id -> (state, settled): the broker's disposition of what we sent."""
    detached: list[tuple[str, Error | None]] = field(default_factory=list)
    """Links the broker detached on its own initiative (not as the answer to our detach)."""
    closed: bool = False


class Peer:
    """One client connection, one session (channel 0)."""

    def __init__(self, world: World, container_id: str) -> None:
        self.world = world
        self.container_id = container_id
        self.conn = ServerConnection()
        world.broker.connection_made(self.conn)
        self.alive = True
        self._header_seen = False
        self._buffer = frames.FrameBuffer()
        self._next_handle = 0
        self._handles: dict[str, int] = {}  # our handle of each attached link, by name
        self._remote: dict[int, str] = {}  # the broker's handle -> link name
        self._detaching: set[str] = set()
        self._delivery_counts: dict[str, int] = {}  # transfers received per consumer link
        self._next_delivery_id = 0
        self.transfers_out = 0
        self.transfers_in = 0
        self.unsettled: dict[int, str] = {}
        """Deliveries we received unsettled and nobody has settled yet: delivery id -> link name."""
        self.observed = Observed()

    # -- sending ------------------------------------------------------------------------------------
    def connect(self) -> None:
        self._feed(AMQP_HEADER + frames.frame(0, frames.open_(self.container_id)) + frames.frame(0, frames.begin()))

    def send(self, performative: Any, payload: bytes = b"") -> None:
        self._feed(frames.frame(0, performative, payload))

    def _feed(self, data: bytes) -> None:
        assert self.alive, f"{self.container_id} is closed"
        world = self.world
        events = self.conn.receive_events(data, world.now)
        world.broker.handle(self.conn, events, world.now)

    def eof(self) -> None:
        """The socket ends without a close frame."""
        self._feed(b"")
        self.alive = False

    def close(self) -> None:
        self.send(Close())
        self.alive = False

    # -- links --------------------------------------------------------------------------------------
    def _new_handle(self, name: str) -> int:
        assert name not in self._handles, f"link {name} already attached"
        handle = self._next_handle
        self._next_handle += 1
        self._handles[name] = handle
        return handle

    def attach_producer(self, name: str, address: str) -> None:
        self.send(frames.attach_sender(address, self._new_handle(name), name))

    def attach_controller(self, name: str) -> None:
        target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        self.send(frames.attach_sender(None, self._new_handle(name), name, target=target, source=Source()))

    def attach_consumer(self, name: str, address: str, *, presettled: bool, default_outcome: Any) -> None:
        source = Source(address=address, default_outcome=default_outcome)
        settle_mode = UInt(1) if presettled else None
        self.send(
            frames.attach_receiver(address, self._new_handle(name), name, source=source, snd_settle_mode=settle_mode)
        )
        self._delivery_counts[name] = 0

    def detach(self, name: str) -> None:
        handle = self._handles.pop(name)
        self._detaching.add(name)
        self._forget_deliveries(name)
        self.send(Detach(handle=UInt(handle), closed=True))

    def _forget_deliveries(self, name: str) -> None:
        """A detached link's unsettled deliveries are no longer ours to settle."""
        self.unsettled = {d: link for d, link in self.unsettled.items() if link != name}

    def attached(self, name: str) -> bool:
        return name in self._handles

    def broker_link(self, name: str) -> Link | None:
        """The engine's record of our link ``name``, as the broker sees it (None once detached)."""
        for session in self.conn.sessions.values():
            for link in session.links.values():
                if link.name == name:
                    return link
        return None

    # -- performatives ------------------------------------------------------------------------------
    def transfer(self, link: str, payload: bytes, *, settled: bool = False, state: Any = None) -> int:
        """Send one message on ``link``; returns its delivery id."""
        delivery_id = self._next_delivery_id
        self._next_delivery_id += 1
        self.transfers_out += 1
        perf = frames.transfer(self._handles[link], delivery_id, settled=settled, state=state)
        self.send(perf, payload)
        return delivery_id

    def declare(self, controller: str) -> int:
        return self.transfer(controller, frames.message(AmqpValue(Declare())))

    def discharge(self, controller: str, txn_id: bytes, *, fail: bool) -> int:
        return self.transfer(controller, frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=fail))))

    def flow(self, link: str, credit: int, properties: dict[Any, Any] | None = None) -> None:
        self.send(
            frames.flow(
                next_incoming_id=self.transfers_in,
                incoming_window=WINDOW,
                next_outgoing_id=self.transfers_out,
                outgoing_window=WINDOW,
                handle=self._handles[link],
                delivery_count=self._delivery_counts[link],
                link_credit=credit,
                properties=properties,
            )
        )

    def dispose(self, delivery_id: int, state: Any, *, settled: bool) -> None:
        """Our disposition (as receiver) of a delivery the broker sent."""
        if settled:
            self.unsettled.pop(delivery_id, None)
        self.send(frames.disposition(delivery_id, settled=settled, state=state))

    # -- receiving ----------------------------------------------------------------------------------
    def take_output(self) -> list[Any]:
        """Decode what the broker wrote; returns performatives the peer must answer (detach replies)."""
        data = self.conn.data_to_send()
        if not self._header_seen and data:
            header, data = frames.split_header(data)
            assert header == AMQP_HEADER
            self._header_seen = True
        self._buffer.feed(data)
        replies: list[Any] = []
        while (item := self._buffer.next_frame()) is not None:
            if item.performative is not None:
                self._on_frame(item.performative, item.payload, replies)
        return replies

    def _on_frame(self, perf: Any, payload: bytes, replies: list[Any]) -> None:
        obs = self.observed
        if isinstance(perf, Attach):
            assert perf.name is not None
            assert perf.handle is not None
            self._remote[perf.handle] = perf.name
        elif isinstance(perf, Transfer):
            assert not perf.more, "the test's messages fit in one frame"
            name = self._remote[perf.handle or 0]
            assert perf.delivery_id is not None
            self.transfers_in += 1
            self._delivery_counts[name] += 1
            body, count = decode_message(payload)
            settled = bool(perf.settled)
            obs.transfers.append(Transferred(name, perf.delivery_id, settled, perf.state, body, count))
            if not settled:
                self.unsettled[perf.delivery_id] = name
        elif isinstance(perf, Disposition):
            first = perf.first or 0
            last = first if perf.last is None else perf.last
            for delivery_id in range(first, last + 1):
                if perf.role == frames.SENDER:  # the broker, as sender, settles what it sent us
                    assert perf.settled, f"broker disposition of its own delivery that does not settle: {perf}"
                    obs.settled_by_broker.append((delivery_id, perf.state))
                    self.unsettled.pop(delivery_id, None)
                else:
                    assert delivery_id not in obs.answers, f"two answers for our delivery {delivery_id}"
                    obs.answers[delivery_id] = (perf.state, bool(perf.settled))
        elif isinstance(perf, Detach):
            name = self._remote.pop(perf.handle or 0)
            if name in self._detaching:
                self._detaching.discard(name)
            else:
                obs.detached.append((name, perf.error))
                handle = self._handles.pop(name)
                self._forget_deliveries(name)
                replies.append(Detach(handle=UInt(handle), closed=True))
        elif isinstance(perf, Close):
            obs.closed = True
        elif isinstance(perf, Flow):
            pass  # credit for our producers: the broker keeps them topped up


class World:
    """One broker and its in-memory peers."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.peers: list[Peer] = []
        self.now = 0.0

    def connect(self, container_id: str) -> Peer:
        peer = Peer(self, container_id)
        self.peers.append(peer)
        peer.connect()
        return peer

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


def broker_census(broker: Broker) -> list[Any]:
    """Bodies of every message the broker holds (ready or acquired), one entry per message held.

    Acquired messages are found through the consumers of each queue and through open transactions (a
    transaction keeps the deliveries of a detached consumer until it is discharged).
    """
    held: dict[int, Dispatched] = {}
    consumers: list[Consumer] = [c for q in broker.queues.values() for c in q.consumers]
    for txn in broker._txns.values():
        consumers.extend(d.consumer for d in [*txn.acquisitions, *txn.retirements])
    for consumer in consumers:
        for dispatched in consumer.unsettled.values():
            held[id(dispatched)] = dispatched
    bodies = [decode_message(m.payload)[0] for q in broker.queues.values() for m in q.ready]
    bodies += [decode_message(d.message.payload)[0] for d in held.values()]
    return bodies


__all__ = [
    "TXN_ID",
    "Observed",
    "Peer",
    "Transferred",
    "World",
    "broker_census",
    "decode_message",
]
