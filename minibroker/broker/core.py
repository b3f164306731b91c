"""The broker core: nodes, links, dispatch and settlement, driven by engine events (Part 3).

Theory of operation
-------------------
The trio layer hands every batch of engine events to ``Broker.handle(conn, events)``. Each handler is a
plain synchronous call that changes broker state and issues engine commands (accept an attach, deliver,
settle); nothing here awaits, so one handler runs to completion before any other connection is served
and no lock is needed. Every engine given a command is recorded in ``dirty`` so the I/O layer knows
whose socket has bytes to write.

Settlement: a message delivered unsettled stays acquired by its delivery until the consumer's outcome
arrives. Accepted and rejected retire it; released and modified put it back in its queue (modified with
delivery-failed counts one more delivery attempt, §3.4.5). A delivery still unsettled when its link or
connection goes away is released.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from minibroker.amqp.definitions import (
    Accepted,
    Coordinator,
    Modified,
    Rejected,
    Released,
    Source,
    Target,
)
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Symbol
from minibroker.broker.links import Consumer, Producer
from minibroker.broker.message import Message
from minibroker.broker.queue import Queue
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, OutgoingDelivery
from minibroker.engine.events import (
    ConnectionClosed,
    DeliveryUpdated,
    Event,
    IncomingSettled,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferReceived,
)

_ACCEPTED = Accepted()


@dataclass(frozen=True)
class BrokerSettings:
    """Policies of the broker core."""

    auto_create: bool = True
    """Create a queue for an unknown address on attach (else refuse with amqp:not-found)."""
    link_credit: int = 1000
    """Credit granted to each producer link, topped up when half is used."""


class Broker:
    """All broker state; one instance per running server."""

    def __init__(self, settings: BrokerSettings | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.queues: dict[str, Queue] = {}
        self.connections: set[ServerConnection] = set()
        self.dirty: set[ServerConnection] = set()
        self._seq = 0

    # -- nodes ----------------------------------------------------------------------------------------
    def declare_queue(self, name: str) -> Queue:
        """Return the queue called ``name``, creating it if needed."""
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = Queue(name)
        return queue

    def _lookup(self, address: str | None) -> Queue | None:
        if not address:
            return None
        queue = self.queues.get(address)
        if queue is None and self.settings.auto_create:
            queue = self.declare_queue(address)
        return queue

    # -- entry point --------------------------------------------------------------------------------
    def connection_made(self, conn: ServerConnection) -> None:
        """A new connection's engine exists (before any byte was read)."""
        self.connections.add(conn)

    def handle(self, conn: ServerConnection, events: Iterable[Event]) -> None:
        """Apply a batch of events from ``conn``'s engine."""
        for event in events:
            handler = self._HANDLERS.get(type(event))
            if handler is not None:
                handler(self, conn, event)
        for event in conn.take_events():  # events caused by our own commands (refused attach → detach)
            handler = self._HANDLERS.get(type(event))
            if handler is not None:
                handler(self, conn, event)
        if conn.has_output:
            self.dirty.add(conn)

    def take_dirty(self) -> set[ServerConnection]:
        """Engines that have bytes to write since the last call."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    # -- links --------------------------------------------------------------------------------------
    def _on_attach(self, conn: ServerConnection, event: LinkAttached) -> None:
        link = event.link
        if link.is_sender:
            self._attach_consumer(conn, link)
        else:
            self._attach_producer(conn, link)

    def _attach_consumer(self, conn: ServerConnection, link: Link) -> None:
        source = link.source
        address = source.address if isinstance(source, Source) else None
        queue = self._lookup(address)
        if queue is None:
            conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {address!r}"))
            return
        reply = Source(
            address=queue.name,
            durable=source.durable,
            expiry_policy=source.expiry_policy,
            timeout=source.timeout,
            distribution_mode=Symbol("move"),
            default_outcome=Modified(delivery_failed=True),
            outcomes=[Symbol(o) for o in ("amqp:accepted:list", "amqp:rejected:list",
                                          "amqp:released:list", "amqp:modified:list")],
            capabilities=source.capabilities,
        )  # fmt: skip
        conn.accept_attach(link, source=reply, target=link.target)
        consumer = Consumer(conn, link, queue)
        link.context = consumer
        queue.add_consumer(consumer)

    def _attach_producer(self, conn: ServerConnection, link: Link) -> None:
        target = link.target
        if isinstance(target, Coordinator):
            conn.refuse_attach(link, error(Condition.NOT_IMPLEMENTED, "transactions are not available"))
            return
        address = target.address if isinstance(target, Target) else None
        queue = self._lookup(address)
        if queue is None:
            conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {address!r}"))
            return
        conn.accept_attach(link, source=link.source, target=target)
        link.context = Producer(conn, link, queue)
        conn.grant_credit(link, self.settings.link_credit)

    def _on_detach(self, conn: ServerConnection, event: LinkDetached) -> None:
        context = event.link.context
        if isinstance(context, Consumer):
            context.queue.remove_consumer(context)
            queue = context.queue
            # §3.4: unsettled deliveries of a link that is gone go back to their queue (released)
            for delivery in list(context.unsettled.values()):
                self._release(context, delivery)
            context.unsettled.clear()
            self._dispatch(queue)
        event.link.context = None

    def _on_closed(self, conn: ServerConnection, event: ConnectionClosed) -> None:
        self.connections.discard(conn)
        self.dirty.discard(conn)

    # -- credit -------------------------------------------------------------------------------------
    def _on_link_flow(self, conn: ServerConnection, event: LinkFlow) -> None:
        consumer = event.link.context
        if isinstance(consumer, Consumer):
            self._dispatch(consumer.queue)
            if consumer.link.drain:
                conn.complete_drain(consumer.link)
                self.dirty.add(conn)

    def _on_session_flow(self, conn: ServerConnection, event: SessionFlow) -> None:
        queues = {link.context.queue for link in event.session.links.values() if isinstance(link.context, Consumer)}
        for queue in queues:
            self._dispatch(queue)

    # -- messages in --------------------------------------------------------------------------------
    def _on_transfer(self, conn: ServerConnection, event: TransferReceived) -> None:
        producer = event.link.context
        if not isinstance(producer, Producer) or producer.queue is None:
            return
        link = producer.link
        self._seq += 1
        message = Message(event.payload, self._seq)
        producer.queue.put(message)
        self._settle_incoming(conn, event.delivery, _ACCEPTED)
        if link.credit < self.settings.link_credit // 2:
            conn.grant_credit(link, self.settings.link_credit)
        self._dispatch(producer.queue)

    def _settle_incoming(self, conn: ServerConnection, delivery: IncomingDelivery, state: Any) -> None:
        if delivery.settled:
            return
        # rcv-settle-mode second (§2.8.3): we give the outcome and settle only after the sender does
        settled = delivery.link.rcv_settle_mode != 1
        conn.dispose_incoming([delivery], state, settled=settled)

    def _on_incoming_settled(self, conn: ServerConnection, event: IncomingSettled) -> None:
        """The producer settled; with rcv-settle-mode second we may now forget the delivery."""

    # -- messages out -------------------------------------------------------------------------------
    def _dispatch(self, queue: Queue) -> None:
        """Send ready messages of ``queue`` to consumers with credit, round-robin."""
        while queue.ready:
            consumer = queue.next_consumer()
            if consumer is None:
                break
            message = queue.acquire()
            conn = consumer.conn
            presettled = consumer.presettled
            delivery = conn.deliver(consumer.link, message.encoded(), settled=presettled, context=message)
            self.dirty.add(conn)
            if presettled:
                queue.retire()
            else:
                consumer.unsettled[delivery.delivery_id] = delivery

    def _on_delivery_updated(self, conn: ServerConnection, event: DeliveryUpdated) -> None:
        queues = set()
        to_settle: list[OutgoingDelivery] = []
        state = event.state
        for delivery in event.deliveries:
            consumer = delivery.link.context
            if not isinstance(consumer, Consumer) or delivery.delivery_id not in consumer.unsettled:
                continue
            if state is None and not event.settled:
                continue
            if isinstance(state, Released | Modified):
                self._release(consumer, delivery, state)
            elif isinstance(state, Accepted | Rejected) or (state is None and event.settled):
                del consumer.unsettled[delivery.delivery_id]
                consumer.queue.retire()
            else:
                continue  # a non-terminal state (received): the delivery stays acquired
            queues.add(consumer.queue)
            if not event.settled:
                to_settle.append(delivery)
        if to_settle:
            conn.settle(to_settle, state)
            self.dirty.add(conn)
        for queue in queues:
            self._dispatch(queue)

    def _release(self, consumer: Consumer, delivery: OutgoingDelivery, outcome: Any = None) -> None:
        message: Message = delivery.context
        consumer.unsettled.pop(delivery.delivery_id, None)
        delivery.link.session.outgoing_unsettled.pop(delivery.delivery_id, None)
        if isinstance(outcome, Modified) and outcome.delivery_failed:
            message.delivery_count += 1
        consumer.queue.requeue(message)

    _HANDLERS: dict[type, Any] = {
        LinkAttached: _on_attach,
        LinkDetached: _on_detach,
        ConnectionClosed: _on_closed,
        LinkFlow: _on_link_flow,
        SessionFlow: _on_session_flow,
        TransferReceived: _on_transfer,
        IncomingSettled: _on_incoming_settled,
        DeliveryUpdated: _on_delivery_updated,
    }
