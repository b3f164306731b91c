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
- ``Endpoints``: links from attach (decided by ``attach.decide``) to detach, credit, incoming transfers;
- ``RabbitModel`` (made by ``Endpoints``): RabbitMQ's exchanges, bindings and queue declarations (issue 18).

Containment: an exception escaping a handler is a bug, and a bug must cost at most the connection whose
step it was, never the broker. ``handle`` closes that connection with ``amqp:internal-error`` (its links
detach, so its unsettled messages go back to their queues and its transactions roll back, like any closed
connection) and logs the error; every other connection goes on. Steps tied to no connection (a timer, an
answer that waited for the journal) are each run on their own: an error in one is logged and the others
still run, and a transaction whose time-out failed half-way is forgotten rather than timed out again and
again.

This module holds no routing, dispatch or transaction logic: only the wiring, and the embedder's API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, KeysView
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.broker.clock import BrokerClock, WallClock
from minibroker.broker.coordinator import Coordinator
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.endpoints import Endpoints
from minibroker.broker.faults import Faults, FaultSpec
from minibroker.broker.injection import Injection
from minibroker.broker.message import Message
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.personality import Personality
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import Action, JournalEntry, Recorder
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import Topic
from minibroker.broker.transactions import TransactionInfo, TransactionStats, counter_ids
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

if TYPE_CHECKING:
    from minibroker.broker.views import ConnectionInfo
    from minibroker.store.state import DurableState

_made = attrgetter("made")  # a connection's place among the connections made

OFFERED_CAPABILITIES = ("ANONYMOUS-RELAY", "SHARED-SUBS", "DELAYED_DELIVERY")
"""What the broker's open offers (Qpid JMS checks each before using the feature): the anonymous relay (a null target
routes each message by its ``to``), shared subscriptions (source capability ``shared``, see ``topic.py``) and delayed
delivery (``x-opt-delivery-time`` and the other scheduling annotations, see ``dispatch.py``)."""

log = logging.getLogger("minibroker.broker")
INTERNAL_ERROR = "internal error in the broker (logged); this connection is closed, the broker goes on"


def contain(what: str, step: Callable[[], object]) -> bool:
    """Run ``step``; an exception is logged (naming ``what``) and goes no further. Whether it ran clean."""
    try:
        step()
    except Exception:
        log.exception("internal error in %s; contained, the broker goes on", what)
        return False
    return True


class _Contained:
    """``contain``, counting the errors it stopped (``Broker.internal_errors``)."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors = 0

    def __call__(self, what: str, step: Callable[[], object]) -> bool:
        if contain(what, step):
            return True
        self.errors += 1
        return False


class Broker:
    """All broker state; one instance per running server."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        txn_ids: Iterator[bytes] | None = None,
        clock: WallClock | None = None,
        *,
        durable: bool = False,
        dynamic_ids: Iterator[str] | None = None,
    ) -> None:
        """``txn_ids`` and ``dynamic_ids`` (the random part of dynamic nodes' addresses) may be given by a test
        that needs them the same in every run."""
        self.settings = settings or BrokerSettings()
        self.clock = BrokerClock(clock)
        self.outbox = Outbox()
        self.recorder = Recorder(durable, DEFAULT_NAMESPACE, self.clock)
        self.nodes = Nodes(self.settings, self.recorder, dynamic_ids)
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
        self.endpoints = Endpoints(
            self.settings, self.nodes, self.dispatcher, self.coordinator, self.outbox, clock=self.clock
        )
        self.nodes.first_auto_node = self._deadline_moved  # the idle sweep has something to look at
        settings = self.settings
        policies = [settings.node_defaults, *settings.queues.values(), *settings.topics.values()]
        if any(p.message_ttl is not None or p.max_priority is not None for p in policies):
            self.dispatcher.own_copies = True  # configured nodes with RabbitMQ's ttl or priorities
        self.rabbit = self.endpoints.rabbit
        """RabbitMQ's model: exchanges, bindings, queue declarations (``rabbit.py``, issue 18)."""
        timers_forget = self.nodes.queue_gone

        def queue_gone(queue: Queue) -> None:
            timers_forget(queue)
            self.rabbit.queue_gone(queue)

        self.nodes.queue_gone = queue_gone
        self.faults = Faults()
        """Fault injection rules (``faults.py``); ``add_fault`` adds one."""
        self.injection = Injection(self.faults, self.clock, self._deadline_moved, self._drop)
        self._dropped: set[ServerConnection] = set()
        for component in (self.dispatcher, self.coordinator, self.endpoints):
            component.injection = self.injection
        self.coordinator.close_connection = self._close
        self.rabbit.later = self.injection.later  # x-expires on the broker clock
        self.take_dirty = self.outbox.take_dirty
        """Engines that have bytes to write since the last call."""
        self._contain = _Contained()
        self.on_change: Callable[[], None] | None = None
        """Called after every batch of events (the I/O layer uses it to wake waiters)."""
        self.on_new_deadline: Callable[[], None] | None = None
        """Called when ``next_deadline`` may have moved earlier (the I/O layer re-arms its timer)."""
        self.journal_sink: Any = None
        """Set by the I/O layer: the journal writer, told after every batch (see server/journal.py); records go
        to it as they are made (``recorder.sink``)."""
        self._handlers: dict[type[Event], Callable[[ServerConnection, Any], None]] = {
            ConnectionOpened: self._connection_opened,
            ConnectionClosed: self._connection_closed,
            LinkAttached: self.endpoints.attached,
            LinkDetached: self.endpoints.detached,
            LinkFlow: self.endpoints.flow,
            SessionFlow: self.endpoints.session_flow,
            TransferReceived: self.endpoints.transfer,
            TransferDiscarded: self.endpoints.transfer_discarded,
            DeliveryUpdated: self.coordinator.disposition,
        }

    def _connection_opened(self, conn: ServerConnection, event: ConnectionOpened) -> None:
        self.nodes.connection_opened(conn, event.open.hostname)
        if self.injection.rules:
            self._connection_fault(conn)

    def _connection_fault(self, conn: ServerConnection) -> None:
        """Fault point ``connection``: ``close`` (with the rule's condition, after its delay) or ``drop``."""
        remote = conn.remote_open
        rule = self.injection.fire("connection", conn, remote.hostname if remote is not None else None)
        if rule is None:
            return
        if rule.action == "drop":
            self._drop(conn)
        elif rule.delay:
            self.injection.later(rule.delay, partial(self._close_open, conn, rule.error()))
        else:
            self._close(conn, rule.error())

    def _close_open(self, conn: ServerConnection, err: Error) -> None:
        if conn in self.nodes.connections and not conn.finished:
            self._close(conn, err)

    def _drop(self, conn: ServerConnection) -> None:
        """Cut ``conn`` with no close frame (a fault's ``drop``); the events that follow are handled with the step
        that dropped it, as for any connection closed by a command."""
        conn.drop()
        self.outbox.dirty.add(conn)
        self._dropped.add(conn)

    def add_fault(self, spec: FaultSpec, now: float | None = None) -> int:
        """Add a fault rule (at broker time ``now``, when given); its id. A ``connection`` rule also fires at once on
        the open connections it matches (in the order they came), so a test can close or drop a connection it
        already has."""
        if now is not None:
            self.clock.now = now
        rule = self.faults.add(spec)
        if spec.point == "connection":
            for conn in sorted(self.nodes.connections, key=lambda c: c.conn_id):
                if conn.remote_open is not None and not conn.finished:
                    self._connection_fault(conn)
            self._handle_caused()
            self._changed()
        return rule.id

    def _connection_closed(self, conn: ServerConnection, event: ConnectionClosed) -> None:
        # each part on its own: a failure in one must not leave the connection registered elsewhere
        what = f"closing connection {conn.conn_id}"
        self._contain(what, lambda: self.coordinator.connection_closed(conn))
        self._contain(what, lambda: self.rabbit.connection_closed(conn))
        self._contain(what, lambda: self.nodes.connection_closed(conn))
        self._contain(what, lambda: self.outbox.forget(conn))

    def _close(self, conn: ServerConnection, err: Error) -> None:
        """Close ``conn`` with ``err`` (a personality's answer to a time-out or an unknown txn-id); what the close
        causes (its links detach, its transactions roll back) is handled with the step that closed it."""
        conn.close(err)
        self.outbox.dirty.add(conn)

    def _handle_caused(self) -> None:
        """Handle the events our own commands caused outside any read (a connection closed by a timer), connection
        by connection in the order they were made, not in a set's (their addresses in memory): what one's close
        puts back on a queue goes to a consumer of another, so the order is seen by the peers."""
        dirty = self.outbox.dirty
        for conn in sorted(dirty, key=_made) if len(dirty) > 1 else list(dirty):
            caused = conn.take_events()
            if caused:
                self._apply_contained(conn, caused)
                if conn.has_output:  # (a closed connection is forgotten by the outbox, but its close must go out)
                    dirty.add(conn)

    def _deadline_moved(self) -> None:
        if self.on_new_deadline is not None:
            self.on_new_deadline()

    # -- entry points -------------------------------------------------------------------------------
    def connection_made(self, conn: ServerConnection, namespace: Namespace | None = None) -> None:
        """A new connection's engine exists (before any byte was read); it came in for ``namespace``."""
        self.nodes.connection_made(conn, namespace)

    def handle(self, conn: ServerConnection, events: Iterable[Event], now: float = 0.0) -> None:
        """Apply a batch of events from ``conn``'s engine (never raises: see "Containment" above)."""
        self.clock.now = now
        self._apply_contained(conn, events)
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
                        self._apply_contained(other, caused)
                        if other in self.coordinator.waiting:
                            self._step(other, partial(self.coordinator.answer_waiting, other))
        if conn in self.coordinator.waiting:  # (rare: checked here, so a batch builds no closure for it, issue 19)
            self._step(conn, partial(self.coordinator.answer_waiting, conn))
        self._changed()

    def _changed(self) -> None:
        if self._dropped:
            # connections a fault dropped: their close took them out of ``dirty`` (``Outbox.forget``), yet the I/O
            # layer must still be woken for them, to see them finished and close their sockets
            self.outbox.dirty.update(self._dropped)
            self._dropped.clear()
        if self.on_change is not None:
            self._contain("a change listener", self.on_change)

    def _step(self, conn: ServerConnection, step: Callable[[], object]) -> None:
        """Run a step on behalf of ``conn``; an error in it closes ``conn`` with ``amqp:internal-error``."""
        try:
            step()
        except Exception as exc:
            self.fail(conn, exc)

    def _apply_contained(self, conn: ServerConnection, events: Iterable[Event]) -> None:
        """Handle ``events`` in order (taken one at a time: a lazy stream parses the next frame only after
        the handler of the previous event has run), then those our own commands caused; an error closes ``conn``
        (``fail``). One function, not a containing one around another: it runs for every read (issue 19)."""
        handlers = self._handlers
        outbox = self.outbox
        pending: Iterable[Event] = events
        try:
            while True:
                for event in pending:
                    handler = handlers.get(type(event))
                    if handler is not None:
                        handler(conn, event)
                if outbox.pending:
                    outbox.flush(conn)
                pending = conn.take_events()  # caused by our own commands (a detach after a refused attach)
                if not pending:
                    return
        except Exception as exc:
            close = getattr(events, "close", None)
            if close is not None:
                close()  # the rest of that read is never acted on: the connection closes
            self.fail(conn, exc)

    def fail(self, conn: ServerConnection, exc: BaseException | None = None) -> None:
        """An internal error in a step of ``conn``: log it, close ``conn`` with ``amqp:internal-error``, and
        hand the broker the detaches and the close that follow (each on its own), as for any closed
        connection: its unsettled messages go back to their queues, its transactions roll back."""
        self._contain.errors += 1
        log.error(
            "internal error while serving connection %s; closing it with amqp:internal-error",
            conn.conn_id,
            exc_info=exc,
        )
        conn.close(error(Condition.INTERNAL_ERROR, INTERNAL_ERROR))
        self.outbox.dirty.add(conn)
        handlers = self._handlers
        what = f"cleaning up connection {conn.conn_id} after an internal error"
        for _ in range(4):  # the close's events, then what handling them caused (bounded: the engine is done)
            pending = conn.take_events()
            if not pending:
                break
            for event in pending:
                handler = handlers.get(type(event))
                if handler is not None:
                    self._contain(what, partial(handler, conn, event))
        # links whose detach was lost with the rest of the failed read (or whose handler failed): each is handled
        # again, so its messages go back, its node is told and it is counted out (once: ``Endpoints`` counts
        # membership)
        lost = dict.fromkeys([*self.dispatcher.consumers_of(conn), *self.endpoints.links_of(conn)])
        for context in lost:
            self._contain(what, partial(self.endpoints.detached, conn, LinkDetached(context.link, False, None)))
        if conn in self.nodes.connections:  # its close never reached us: forget it all the same
            self._connection_closed(conn, ConnectionClosed(None, by_peer=False))

    @property
    def dirty(self) -> set[ServerConnection]:
        """Engines that have bytes to write (the I/O layer may add one whose output it left unwritten)."""
        return self.outbox.dirty

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` must next run: a message timer, a transaction time-out or the idle sweep."""
        deadlines = [
            d
            for d in (
                self.dispatcher.next_deadline(),
                self.coordinator.next_deadline(),
                self.endpoints.next_deadline(),
                self.injection.next_deadline(),
            )
            if d is not None
        ]
        return min(deadlines) if deadlines else None

    def handle_timeout(self, now: float) -> None:
        """Run every timer due at ``now``: expiries, scheduled deliveries, transaction time-outs (each on its
        own: an error in one is logged, and the others run)."""
        self.clock.now = now
        contain = self._contain
        contain("the message timers", lambda: self.dispatcher.handle_timeout(now, contain))
        contain("the transaction time-outs", lambda: self.coordinator.handle_timeout(now, contain))
        contain("the idle-node sweep", lambda: self.endpoints.handle_timeout(now))
        self.injection.run_due(now, contain)
        self._handle_caused()
        self._changed()

    def resume(self, conn: ServerConnection) -> None:
        """``conn``'s peer read what was queued for it: deliveries held back for it may go on."""
        self._step(conn, lambda: self._resume(conn))

    def _resume(self, conn: ServerConnection) -> None:
        self.dispatcher.resume(conn)
        if self.nodes.personality_of(conn).servicebus:
            self.endpoints.event_hubs.resume(conn)  # readers of event hub partitions held back too

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
            self._contain("an answer that waited for the journal", action)
        self.outbox.dirty.update(conn for conn in self.nodes.connections if conn.has_output)
        self._changed()

    def restore(self, state: DurableState, now: float = 0.0) -> int:
        """Recreate durable nodes, subscriptions and messages from a recovered journal, at broker time ``now``;
        how many messages. Messages that expired meanwhile go at once (to the expiry address, or away, and out
        of the journal); scheduled ones wait for their delivery time."""
        from minibroker.broker.recovery import restore  # with a data dir only: not at start-up without (issue 19)

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
    def connections(self) -> KeysView[ServerConnection]:
        """The connections made and not yet closed, in the order they were made (a set-like view)."""
        return self.nodes.connections.keys()

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

    def namespace(self, name: str, personality: Personality | None = None) -> Namespace:
        """The namespace called ``name``, created (with the configured nodes and ``personality``, by default the
        broker's) if needed."""
        return self.nodes.namespace(name, personality)

    def namespace_of(self, conn: ServerConnection) -> Namespace:
        """The namespace ``conn`` works in."""
        return self.nodes.namespace_of(conn)

    def reset(self, namespace: Namespace | None = None) -> None:
        """Drop every node, message and transaction of ``namespace`` (default: the default namespace).

        Its connections are closed with ``amqp:connection:forced`` (rolling back their transactions); other
        namespaces are untouched; configured nodes are created again, empty. O(nodes + connections).
        """
        namespace = namespace or self.nodes.default
        # in the order they came: what one's close puts back goes to a consumer of another still open
        for conn in list(namespace.connections):
            conn.close(error(Condition.CONNECTION_FORCED, f"namespace {namespace.name!r} was reset"))
            self.handle(conn, conn.take_events(), self.clock.now)
        for txn in self.coordinator.check_back.of_namespace(namespace):  # held in doubt by those connections
            self.coordinator.resolve(txn.id, commit=False)
        self.nodes.reset(namespace)
        self.endpoints.namespace_reset(namespace.name)
        self._changed()

    def purge(self, queue: Queue) -> int:
        """Drop every ready message of ``queue``; how many (waiters on broker state are told)."""
        purged = queue.purge()
        self._changed()
        return purged

    def drop_namespace(self, name: str) -> None:
        """Reset and forget a namespace (the default one cannot be dropped, only reset)."""
        namespace = self.nodes.namespaces.get(name)
        if namespace is None:
            return
        self.reset(namespace)
        if namespace is not self.nodes.default:
            del self.nodes.namespaces[name]

    def post(self, namespace: Namespace, address: str, payload: bytes) -> Error | None:
        """Post an encoded message to ``address`` in ``namespace`` as a settled transfer would (the management API):
        the node is created when an attach could create it. None when it was taken, else why not."""
        message = Message(payload, limit=self.settings.max_selector_properties_size or None)
        if message.malformed is not None:
            return error(
                Condition.DECODE_ERROR, f"the message's header or annotations do not decode: {message.malformed}"
            )
        node = namespace.node(address)
        if node is None:
            if not self.nodes.creatable(address):
                return error(Condition.NOT_FOUND, f"no node at {address!r}")
            refused = self.nodes.refuse_new_node()
            if refused is not None:
                return refused
            node = self.nodes.create(namespace, address, None, auto=True)
        self.dispatcher.arrive(message)
        refused = self.dispatcher.inject(node, message)
        self._changed()
        return refused

    def delete_node(self, namespace: Namespace, name: str) -> bool:
        """Delete the node ``name`` of ``namespace`` with its messages; its links are detached with
        ``amqp:resource-deleted``. Whether there was such a node."""
        node = namespace.node(name)
        if node is None:
            return False
        self.endpoints.delete_node(node)
        self._changed()
        return True

    def close_connection(self, conn_id: int, err: Error) -> bool:
        """Close connection ``conn_id`` with ``err`` (its links detach, its transactions roll back). Whether it
        was open."""
        conn = next((c for c in self.nodes.connections if c.conn_id == conn_id), None)
        if conn is None:
            return False
        conn.close(err)
        self.handle(conn, conn.take_events(), self.clock.now)
        return True

    # -- introspection ------------------------------------------------------------------------------
    @property
    def internal_errors(self) -> int:
        """Internal errors contained so far (each logged; 0 unless the broker has a bug)."""
        return self._contain.errors

    @property
    def txn_stats(self) -> TransactionStats:
        """The transaction counters now (a snapshot: read the property again for later figures)."""
        return self.coordinator.counters.snapshot()

    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open and in-doubt transactions with what each has staged, oldest first."""
        return self.coordinator.infos(self.clock.now)

    def transactions_at(
        self, now: float, conns: Collection[ServerConnection] | None = None, namespace: Namespace | None = None
    ) -> list[TransactionInfo]:
        """``transactions`` with ages computed at ``now`` (only those of ``conns``, and those held in doubt for
        ``namespace``, when given)."""
        return self.coordinator.infos(now, conns, namespace)

    def resolve_transaction(
        self, txn_id: bytes, *, commit: bool, namespace: Namespace | None = None
    ) -> tuple[str, Error | None]:
        """Commit (or roll back) the in-doubt transaction ``txn_id`` (of ``namespace`` when given): its state then,
        ``committed`` or ``rolled-back``, and why a commit could not be applied. ``LookupError`` when no such
        transaction is in doubt (``checkback.py``)."""
        result = self.coordinator.resolve(txn_id, commit=commit, namespace=namespace)
        self._handle_caused()
        self._changed()
        return result

    def node_counts(self, queue: Queue) -> dict[str, int]:
        """The counts of ``queue`` (a subscription is one too) now, by the names of ``views.NodeCounts``."""
        return {
            "ready": queue.depth,
            "acquired": queue.acquired,
            "staged": queue.staged,
            "consumers": self.dispatcher.consumer_count(queue),
            "enqueued_total": queue.enqueued_total,
            "dequeued_total": queue.dequeued_total,
            "scheduled": queue.scheduled,
        }

    def connection_infos(self, namespace: Namespace | None = None) -> list[ConnectionInfo]:
        """The open connections (of ``namespace`` when given), in the order they came."""
        from minibroker.broker.views import ConnectionInfo  # the views load on the first read (issue 19)

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
