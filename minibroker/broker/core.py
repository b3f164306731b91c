"""The broker core: its components, and which of them handles each engine event (Part 3, Part 4).

Theory of operation
-------------------
The trio layer hands every batch of engine events to ``Broker.handle(conn, events, now)``. Each event goes
to the one component that owns its concern (the table in ``__init__``); each handler is a plain synchronous
call that changes broker state and issues engine commands (accept an attach, deliver, settle), so one batch
runs to completion before any other connection is served and no lock is needed. Time arrives as ``now``;
timers (message expiry, scheduled delivery, redelivery delays, transaction time-outs) run when the I/O
layer calls ``handle_timeout`` at ``next_deadline``.

The components, each owning its state (dependencies point one way, down this list):

- ``Outbox``: answers batched per read, and which connections have output;
- ``Recorder``: journal records and answers that wait for the disk;
- ``Nodes``: namespaces, queues, topics, subscriptions, and the namespace of each connection;
- ``Dispatcher``: routing, consumer groups, dispatch, outcomes, dead-letters, message timers;
- ``Coordinator``: transactions, and every relation between a transaction and a delivery or a link;
- ``Endpoints``: links from attach (decided by ``attach.decide``) to detach, credit, incoming transfers.

This module holds no routing, dispatch or transaction logic: only the wiring, and the embedder's API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from minibroker.amqp.errors import Condition, error
from minibroker.broker.clock import BrokerClock, WallClock
from minibroker.broker.coordinator import Coordinator
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.endpoints import Endpoints
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import Action, JournalEntry, Recorder
from minibroker.broker.recovery import restore
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import Topic
from minibroker.broker.transactions import TransactionInfo, TransactionStats, counter_ids
from minibroker.broker.views import ConnectionInfo
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferDiscarded,
    TransferReceived,
)
from minibroker.store.journal import DurableState

OFFERED_CAPABILITIES = ("ANONYMOUS-RELAY", "SHARED-SUBS", "DELAYED_DELIVERY")
"""What the broker's open offers (Qpid JMS checks each before using the feature): the anonymous relay (a null target
routes each message by its ``to``), shared subscriptions (source capability ``shared``, see ``topic.py``) and delayed
delivery (``x-opt-delivery-time`` and the other scheduling annotations, see ``dispatch.py``)."""


class Broker:
    """All broker state; one instance per running server."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        txn_ids: Iterator[bytes] | None = None,
        clock: WallClock | None = None,
        *,
        durable: bool = False,
    ) -> None:
        self.settings = settings or BrokerSettings()
        self.clock = BrokerClock(clock)
        self.outbox = Outbox()
        self.recorder = Recorder(durable, DEFAULT_NAMESPACE, self.clock)
        self.nodes = Nodes(self.settings, self.recorder)
        self.dispatcher = Dispatcher(self.clock, self.nodes, self.recorder, self.outbox, self._deadline_moved)
        self.coordinator = Coordinator(
            self.settings,
            self.clock,
            self.nodes,
            self.dispatcher,
            self.outbox,
            self.recorder,
            txn_ids if txn_ids is not None else counter_ids(),
            self._deadline_moved,
        )
        self.endpoints = Endpoints(self.settings, self.nodes, self.dispatcher, self.coordinator, self.outbox)
        self.take_dirty = self.outbox.take_dirty
        """Engines that have bytes to write since the last call."""
        self.on_change: Callable[[], None] | None = None
        """Called after every batch of events (the I/O layer uses it to wake waiters)."""
        self.on_new_deadline: Callable[[], None] | None = None
        """Called when ``next_deadline`` may have moved earlier (the I/O layer re-arms its timer)."""
        self.journal_sink: Any = None
        """Set by the I/O layer: the journal writer, told after every batch (see server/journal.py); records go
        to it as they are made (``recorder.sink``)."""
        self._handlers: dict[type[Event], Callable[[ServerConnection, Any], None]] = {
            ConnectionOpened: lambda conn, event: self.nodes.connection_opened(conn, event.open.hostname),
            ConnectionClosed: self._connection_closed,
            LinkAttached: self.endpoints.attached,
            LinkDetached: self.endpoints.detached,
            LinkFlow: self.endpoints.flow,
            SessionFlow: self.endpoints.session_flow,
            TransferReceived: self.endpoints.transfer,
            TransferDiscarded: self.endpoints.transfer_discarded,
            DeliveryUpdated: self.coordinator.disposition,
        }

    def _connection_closed(self, conn: ServerConnection, event: ConnectionClosed) -> None:
        self.coordinator.connection_closed(conn)
        self.nodes.connection_closed(conn)
        self.outbox.forget(conn)

    def _deadline_moved(self) -> None:
        if self.on_new_deadline is not None:
            self.on_new_deadline()

    # -- entry points -------------------------------------------------------------------------------
    def connection_made(self, conn: ServerConnection, namespace: Namespace | None = None) -> None:
        """A new connection's engine exists (before any byte was read); it came in for ``namespace``."""
        self.nodes.connection_made(conn, namespace)

    def handle(self, conn: ServerConnection, events: Iterable[Event], now: float = 0.0) -> None:
        """Apply a batch of events from ``conn``'s engine."""
        self.clock.now = now
        self._apply(conn, events)
        dirty = self.outbox.dirty
        if conn.has_output:
            dirty.add(conn)
        if len(dirty) > 1 or (conn not in dirty and dirty):
            # commands given to other connections (a link detached because its node went) may have produced
            # events there too: handle them now rather than at that connection's next read
            for other in list(dirty):
                if other is not conn:
                    caused = other.take_events()
                    if caused:
                        self._apply(other, caused)
                        self.coordinator.answer_waiting(other)
        self.coordinator.answer_waiting(conn)
        if self.on_change is not None:
            self.on_change()

    def _apply(self, conn: ServerConnection, events: Iterable[Event]) -> None:
        """Handle ``events`` in order (taken one at a time: a lazy stream parses the next frame only after
        the handler of the previous event has run), then those our own commands caused."""
        handlers = self._handlers
        outbox = self.outbox
        pending: Iterable[Event] = events
        while True:
            for event in pending:
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(conn, event)
            if outbox.waiting_answers:
                outbox.flush(conn)
            pending = conn.take_events()  # caused by our own commands (a detach after a refused attach)
            if not pending:
                return

    @property
    def dirty(self) -> set[ServerConnection]:
        """Engines that have bytes to write (the I/O layer may add one whose output it left unwritten)."""
        return self.outbox.dirty

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` must next run: a message timer or a transaction time-out."""
        deadlines = [d for d in (self.dispatcher.next_deadline(), self.coordinator.next_deadline()) if d is not None]
        return min(deadlines) if deadlines else None

    def handle_timeout(self, now: float) -> None:
        """Run every timer due at ``now``: expiries, scheduled deliveries, transaction time-outs."""
        self.clock.now = now
        self.dispatcher.handle_timeout(now)
        self.coordinator.handle_timeout(now)
        if self.on_change is not None:
            self.on_change()

    def resume(self, conn: ServerConnection) -> None:
        """``conn``'s peer read what was queued for it: deliveries held back for it may go on."""
        self.dispatcher.resume(conn)

    # -- durability ---------------------------------------------------------------------------------
    @property
    def durable(self) -> bool:
        return self.recorder.durable

    def take_journal(self) -> list[JournalEntry]:
        """Records made while no journal writer was connected (recovery's), in order."""
        return self.recorder.take_journal()

    def run_durable(self, actions: list[Action], now: float) -> None:
        """Run actions whose journal records are now on disk (answers that waited for durability)."""
        self.clock.now = now
        for action in actions:
            action()
        self.outbox.dirty.update(conn for conn in self.nodes.connections if conn.has_output)
        if self.on_change is not None:
            self.on_change()

    def restore(self, state: DurableState, now: float = 0.0) -> int:
        """Recreate durable nodes, subscriptions and messages from a recovered journal, at broker time ``now``;
        how many messages. Messages that expired meanwhile go at once (to the expiry address, or away, and out
        of the journal); scheduled ones wait for their delivery time."""
        self.clock.now = now
        restored = restore(state, self.nodes, self.dispatcher, self.recorder)
        self.dispatcher.handle_timeout(now)
        return restored

    # -- nodes and namespaces -------------------------------------------------------------------------
    @property
    def default(self) -> Namespace:
        return self.nodes.default

    @property
    def namespaces(self) -> dict[str, Namespace]:
        return self.nodes.namespaces

    @property
    def connections(self) -> set[ServerConnection]:
        return self.nodes.connections

    @property
    def queues(self) -> dict[str, Queue]:
        """The queues of the default namespace."""
        return self.nodes.default.queues

    @property
    def topics(self) -> dict[str, Topic]:
        """The topics of the default namespace."""
        return self.nodes.default.topics

    def declare_queue(self, name: str, namespace: Namespace | None = None) -> Queue:
        """Return the queue called ``name`` (in the default namespace unless told), creating it if needed."""
        return self.nodes.queue(name, namespace)

    def namespace(self, name: str) -> Namespace:
        """The namespace called ``name``, created (with the configured nodes) if needed."""
        return self.nodes.namespace(name)

    def namespace_of(self, conn: ServerConnection) -> Namespace:
        """The namespace ``conn`` works in."""
        return self.nodes.namespace_of(conn)

    def reset(self, namespace: Namespace | None = None) -> None:
        """Drop every node, message and transaction of ``namespace`` (default: the default namespace).

        Its connections are closed with ``amqp:connection:forced`` (rolling back their transactions); other
        namespaces are untouched; configured nodes are created again, empty. O(nodes + connections).
        """
        namespace = namespace or self.nodes.default
        for conn in list(namespace.connections):
            conn.close(error(Condition.CONNECTION_FORCED, f"namespace {namespace.name!r} was reset"))
            self.handle(conn, conn.take_events(), self.clock.now)
        self.nodes.reset(namespace)

    def drop_namespace(self, name: str) -> None:
        """Reset and forget a namespace (the default one cannot be dropped, only reset)."""
        namespace = self.nodes.namespaces.get(name)
        if namespace is None:
            return
        self.reset(namespace)
        if namespace is not self.nodes.default:
            del self.nodes.namespaces[name]

    # -- introspection ------------------------------------------------------------------------------
    @property
    def txn_stats(self) -> TransactionStats:
        return self.coordinator.stats

    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions with what each has staged, oldest first."""
        return self.coordinator.infos(self.clock.now)

    def transactions_at(self, now: float, conns: set[ServerConnection] | None = None) -> list[TransactionInfo]:
        """``transactions`` with ages computed at ``now`` (only those of ``conns`` when given)."""
        return self.coordinator.infos(now, conns)

    def connection_infos(self, namespace: Namespace | None = None) -> list[ConnectionInfo]:
        """The open connections (of ``namespace`` when given), in the order they came."""
        conns = self.nodes.connections if namespace is None else namespace.connections
        infos = []
        for conn in conns:
            remote = conn.remote_open
            infos.append(
                ConnectionInfo(
                    id=conn.conn_id,
                    container_id=str(remote.container_id) if remote is not None else "",
                    hostname=remote.hostname if remote is not None else None,
                    namespace=self.nodes.namespace_of(conn).name,
                    user=conn.user,
                    sessions=conn.session_count,
                    links=conn.link_count,
                )
            )
        return sorted(infos, key=lambda i: i.id)


__all__ = ["OFFERED_CAPABILITIES", "Broker", "BrokerSettings"]
