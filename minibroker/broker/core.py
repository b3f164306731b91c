"""The broker core: connections, namespaces, links and credit, driven by engine events (Part 3).

Theory of operation
-------------------
The trio layer hands every batch of engine events to ``Broker.handle(conn, events, now)``. Each handler
is a plain synchronous call that changes broker state and issues engine commands (accept an attach,
deliver, settle); nothing here awaits, so one handler runs to completion before any other connection is
served and no lock is needed. Every engine given a command is recorded in ``dirty`` so the I/O layer
knows whose socket has bytes to write. Time arrives as ``now``; timers (message expiry, scheduled
delivery, redelivery delays, transaction time-outs) run when the I/O layer calls ``handle_timeout`` at
``next_deadline``.

This module attaches links to nodes: a receiver link becomes a ``Consumer`` of a queue, of a topic
subscription, or a browser; a sender link a ``Producer`` of a node, or of the anonymous relay; a
coordinator target a ``Controller``. Messages move in ``delivery.py``; transactions live in
``coordinator.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import count
from typing import Any

from minibroker.amqp.definitions import (
    Accepted,
    Coordinator,
    Modified,
    Rejected,
    Released,
    Source,
    Target,
    TransactionalState,
)
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Described, Symbol
from minibroker.broker.clock import WallClock
from minibroker.broker.coordinator import ACCEPTED, CONTROLLER_CREDIT, CoordinatorMixin
from minibroker.broker.links import RELEASED, Consumer, Controller, Producer
from minibroker.broker.message import Message
from minibroker.broker.namespace import DEFAULT_NAMESPACE, QUEUE, TOPIC, Namespace, Node, parse_address
from minibroker.broker.queue import Queue
from minibroker.broker.state import BrokerSettings
from minibroker.broker.timers import Timers
from minibroker.broker.topic import Subscription, Topic
from minibroker.broker.transactions import TXN_CAPABILITIES, TransactionInfo, TransactionStats, counter_ids, info
from minibroker.broker.views import ConnectionInfo
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, LinkState
from minibroker.engine.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    IncomingSettled,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferReceived,
)

_OUTCOMES: list[str] = [
    Symbol(o) for o in ("amqp:accepted:list", "amqp:rejected:list", "amqp:released:list", "amqp:modified:list")
]
_REJECTED_LIST = "amqp:rejected:list"
_TXN_ID = Symbol("txn-id")
_NO_LOCAL = {Symbol("apache.org:no-local-filter:list"), 0x0000468C00000003}
_DURABLE_NONE = 0  # terminus-durability none (§3.5.5)
_SHARED_SUFFIX = re.compile(r"\|.*$")  # Qpid JMS names extra links of a shared subscription "name|n"


def selector_from_filter(filter_set: Any) -> Any:
    """The JMS selector in a source's filter set (the selector module is imported only when one is used)."""
    from minibroker.broker.selector import selector_from_filter as find

    return find(filter_set)


class Broker(CoordinatorMixin):
    """All broker state; one instance per running server."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        txn_ids: Iterator[bytes] | None = None,
        clock: WallClock | None = None,
        *,
        durable: bool = False,
    ) -> None:
        self._init_durability(durable)
        self.settings = settings or BrokerSettings()
        self.clock = clock or WallClock()
        self.namespaces = {}
        self.default = self.namespace(DEFAULT_NAMESPACE)
        self._namespace_of = {}
        self.connections = set()
        self.dirty = set()
        self.timers = Timers()
        self.txn_stats = TransactionStats()
        self._txns = {}
        self._expired = {}
        self._txn_ids = txn_ids if txn_ids is not None else counter_ids()
        self._dynamic_ids = count(1)
        self._answers = {}  # outcomes of this batch of events, answered together in ranges
        self._seq = 0
        self._now = 0.0
        self.on_change = None
        """Called after every batch of events (the I/O layer uses it to wake waiters)."""
        self.on_new_deadline = None
        """Called when ``next_deadline`` may have moved earlier (the I/O layer re-arms its timer)."""

    # -- nodes ----------------------------------------------------------------------------------------
    @property
    def queues(self) -> dict[str, Queue]:
        """The queues of the default namespace."""
        return self.default.queues

    @property
    def topics(self) -> dict[str, Topic]:
        """The topics of the default namespace."""
        return self.default.topics

    def declare_queue(self, name: str, namespace: Namespace | None = None) -> Queue:
        """Return the queue called ``name`` (in the default namespace unless told), creating it if needed."""
        namespace = namespace or self.default
        queue = namespace.queues.get(name)
        if queue is None:
            created = self._create_node(namespace, name, QUEUE)
            assert isinstance(created, Queue)
            queue = created
        return queue

    def _create_node(self, namespace: Namespace, name: str, kind: str | None) -> Node:
        """Create a node; the configuration decides its kind and policy, else ``kind``, else a queue."""
        settings = self.settings
        if name in settings.topics:
            kind, policy = TOPIC, settings.topics[name]
        elif name in settings.queues:
            kind, policy = QUEUE, settings.queues[name]
        else:
            policy = settings.node_defaults
        node: Node
        if kind == TOPIC:
            node = namespace.topics[name] = Topic(name, policy)
            node.namespace = namespace
        else:
            node = namespace.queues[name] = Queue(name, policy)
            node.namespace = namespace
            self._make_durable(node)
        return node

    def _lookup(self, conn: ServerConnection, address: Any, capabilities: Any = None) -> Node | None:
        """The node an address names in ``conn``'s namespace, created when auto-create is on."""
        if not address or not isinstance(address, str):
            return None
        name, kind = parse_address(address, capabilities)
        namespace = self._namespace_of.get(conn, self.default)
        node = namespace.node(name)
        if node is None and self.settings.auto_create:
            node = self._create_node(namespace, name, kind)
        return node

    # -- namespaces -----------------------------------------------------------------------------------
    def namespace(self, name: str) -> Namespace:
        """The namespace called ``name``, created (with the configured nodes) if needed."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            namespace = self.namespaces[name] = Namespace(name)
            self._populate(namespace)
        return namespace

    def _populate(self, namespace: Namespace) -> None:
        for name in self.settings.queues:
            self._create_node(namespace, name, QUEUE)
        for name in self.settings.topics:
            self._create_node(namespace, name, TOPIC)

    def reset(self, namespace: Namespace | None = None) -> None:
        """Drop every node, message and transaction of ``namespace`` (default: the default namespace).

        Its connections are closed with ``amqp:connection:forced`` (rolling back their transactions); other
        namespaces are untouched; configured nodes are created again, empty. O(nodes + connections).
        """
        namespace = namespace or self.default
        for conn in list(namespace.connections):
            conn.close(error(Condition.CONNECTION_FORCED, f"namespace {namespace.name!r} was reset"))
            self.handle(conn, conn.take_events(), self._now)
        for queue in namespace.queues.values():
            queue.purge()  # journaled messages are recorded as gone
            queue.deleted = True
        for topic in namespace.topics.values():
            for subscription in list(topic.subscriptions.values()):
                self._delete_subscription(subscription)
        namespace.queues = {}
        namespace.topics = {}
        self._populate(namespace)

    def drop_namespace(self, name: str) -> None:
        """Reset and forget a namespace (the default one cannot be dropped, only reset)."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            return
        self.reset(namespace)
        if namespace is not self.default:
            del self.namespaces[name]

    def namespace_of(self, conn: ServerConnection) -> Namespace:
        """The namespace ``conn`` works in."""
        return self._namespace_of.get(conn, self.default)

    def _on_opened(self, conn: ServerConnection, event: ConnectionOpened) -> None:
        hostname = event.open.hostname
        chosen = self.namespaces.get(hostname) if hostname else None
        if chosen is not None:
            self._namespace_of[conn].connections.discard(conn)
            chosen.connections.add(conn)
            self._namespace_of[conn] = chosen

    # -- entry points -------------------------------------------------------------------------------
    def connection_made(self, conn: ServerConnection, namespace: Namespace | None = None) -> None:
        """A new connection's engine exists (before any byte was read); it came in for ``namespace``."""
        self.connections.add(conn)
        namespace = namespace or self.default
        namespace.connections.add(conn)
        self._namespace_of[conn] = namespace

    def handle(self, conn: ServerConnection, events: Iterable[Event], now: float = 0.0) -> None:
        """Apply a batch of events from ``conn``'s engine."""
        self._now = now
        pending = list(events)
        while pending:
            for event in pending:
                handler = self._HANDLERS.get(type(event))
                if handler is not None:
                    handler(self, conn, event)
            self._flush_accepts(conn)
            pending = conn.take_events()  # caused by our own commands (a detach after a refused attach)
        if conn.has_output:
            self.dirty.add(conn)
        if self.on_change is not None:
            self.on_change()

    def take_dirty(self) -> set[ServerConnection]:
        """Engines that have bytes to write since the last call."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` must next run: a message timer or a transaction time-out."""
        deadlines = [d for d in (self.timers.next_deadline(), self._transactions_deadline()) if d is not None]
        return min(deadlines) if deadlines else None

    def handle_timeout(self, now: float) -> None:
        """Run every timer due at ``now``: expiries, scheduled deliveries, transaction time-outs."""
        self._now = now
        for timer in self.timers.pop_due(now):
            if not timer.queue.deleted:
                self._on_timer(timer)
        self._expire_transactions(now)
        if self.on_change is not None:
            self.on_change()

    # -- introspection ------------------------------------------------------------------------------
    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions with what each has staged, oldest first."""
        return self.transactions_at(self._now)

    def transactions_at(self, now: float, conns: set[ServerConnection] | None = None) -> list[TransactionInfo]:
        """``transactions`` with ages computed at ``now`` (only those of ``conns`` when given)."""
        txns = sorted(self._txns.values(), key=lambda t: t.created)
        return [info(txn, now) for txn in txns if conns is None or txn.conn in conns]

    def connection_infos(self, namespace: Namespace | None = None) -> list[ConnectionInfo]:
        """The open connections (of ``namespace`` when given), in the order they came."""
        conns = self.connections if namespace is None else namespace.connections
        infos = []
        for conn in conns:
            remote = conn.remote_open
            infos.append(
                ConnectionInfo(
                    id=conn.conn_id,
                    container_id=str(remote.container_id) if remote is not None else "",
                    hostname=remote.hostname if remote is not None else None,
                    namespace=self.namespace_of(conn).name,
                    user=conn.user,
                    sessions=len(conn.sessions),
                    links=sum(len(s.links) for s in conn.sessions.values()),
                )
            )
        return sorted(infos, key=lambda i: i.id)

    # -- attach -----------------------------------------------------------------------------------------
    def _on_attach(self, conn: ServerConnection, event: LinkAttached) -> None:
        link = event.link
        if link.is_sender:
            self._attach_consumer(conn, link)
        elif isinstance(link.target, Coordinator):
            self._attach_controller(conn, link)
        else:
            self._attach_producer(conn, link)

    def _dynamic_node(self, conn: ServerConnection, capabilities: Any) -> Node:
        """A node with a generated address for a dynamic terminus (§3.5.3), deleted with its link."""
        _, kind = parse_address("", capabilities)
        name = f"dynamic.{conn.conn_id}.{next(self._dynamic_ids)}"
        node = self._create_node(self.namespace_of(conn), name, kind)
        node.dynamic = True
        return node

    def _attach_consumer(self, conn: ServerConnection, link: Link) -> None:
        source = link.source
        if not isinstance(source, Source):
            self._resume_subscription(conn, link)
            return
        owned = None
        node: Node | None
        if source.dynamic:
            node = owned = self._dynamic_node(conn, source.capabilities)
        else:
            denied = self._denied(conn, "receive", source.address, source.capabilities)
            if denied is not None:
                conn.refuse_attach(link, denied)
                return
            node = self._lookup(conn, source.address, source.capabilities)
            if node is None:
                conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {source.address!r}"))
                return
        try:
            found = selector_from_filter(source.filter) if source.filter else None
        except ValueError as exc:  # SelectorError
            conn.refuse_attach(link, error(Condition.INVALID_FIELD, f"invalid selector: {exc}"))
            return
        applied: dict[Any, Any] = {}
        selector = None
        if found is not None:
            key, selector = found
            applied[key] = source.filter[key]  # type: ignore[index]
        no_local = self._no_local_filter(source.filter)
        if no_local is not None:
            applied[no_local] = source.filter[no_local]  # type: ignore[index]
        default_outcome = source.default_outcome
        if not isinstance(default_outcome, Released | Modified | Rejected | Accepted):
            default_outcome = RELEASED
        browse = source.distribution_mode == "copy" and isinstance(node, Queue)
        if isinstance(node, Topic):
            queue: Queue = self._subscribe(conn, link, node, source, selector, no_local is not None)
            consumer = Consumer(conn, link, queue, default_outcome)
        else:
            assert isinstance(node, Queue)
            queue = node
            consumer = Consumer(conn, link, queue, default_outcome, selector=selector, browser=browse)
        consumer.owned_node = owned
        reply = Source(
            address=source.address if not source.dynamic else node.name,
            durable=source.durable,
            expiry_policy=source.expiry_policy,
            timeout=source.timeout,
            dynamic=source.dynamic,
            dynamic_node_properties=source.dynamic_node_properties,
            distribution_mode=Symbol("copy" if browse else "move"),
            filter=applied or None,
            default_outcome=default_outcome,
            outcomes=_OUTCOMES,
            capabilities=source.capabilities,
        )
        conn.accept_attach(link, source=reply, target=link.target)
        link.context = consumer
        queue.add_consumer(consumer)
        self._dispatch(queue)

    def _no_local_filter(self, filter_set: Any) -> Any:
        """The key of a no-local filter (apache.org:no-local-filter:list) in a source's filter set."""
        if not isinstance(filter_set, dict):
            return None
        for key, value in filter_set.items():
            if isinstance(value, Described) and value.descriptor in _NO_LOCAL:
                return key
        return None

    def _subscribe(
        self, conn: ServerConnection, link: Link, topic: Topic, source: Source, selector: Any, no_local: bool
    ) -> Subscription:
        capabilities = {str(c) for c in source.capabilities or ()}
        durable = (source.durable or _DURABLE_NONE) != _DURABLE_NONE and source.expiry_policy == "never"
        shared = "shared" in capabilities
        remote = conn.remote_open
        container = "" if "global" in capabilities else str(remote.container_id if remote else "")
        if shared:
            key = (container, _SHARED_SUFFIX.sub("", link.name))
        elif durable:
            key = (container, link.name)
        else:
            key = (f"#{conn.conn_id}", f"{link.name}#{link.session.channel}:{link.input_handle}")
        existing = topic.subscriptions.get(key)
        if existing is not None and not existing.links and selector_source(existing.selector) != selector_source(
            selector
        ):
            # JMS: a durable subscription resumed with another selector starts afresh
            self._delete_subscription(existing)
        created = key not in topic.subscriptions
        subscription = topic.subscribe(
            key, durable=durable, shared=shared, selector=selector, no_local=conn if no_local else None
        )
        if subscription.links == 1:  # resumed (or new): no-local now means this link's connection
            subscription.no_local = conn if no_local else None
        if created and durable:
            self._journal_subscription(subscription, subscribed=True)
        return subscription

    def _resume_subscription(self, conn: ServerConnection, link: Link) -> None:
        """An attach without a source names an existing durable subscription (as JMS unsubscribe does)."""
        remote = conn.remote_open
        container = str(remote.container_id if remote else "")
        namespace = self.namespace_of(conn)
        for topic in namespace.topics.values():
            for key in ((container, link.name), ("", link.name)):
                subscription = topic.subscriptions.get(key)
                if subscription is not None and subscription.durable:
                    denied = self._denied(conn, "receive", topic.name)
                    if denied is not None:  # found by name alone: the topic's permission still applies
                        conn.refuse_attach(link, denied)
                        return
                    subscription.links += 1
                    consumer = Consumer(conn, link, subscription, RELEASED)
                    reply = Source(
                        address=topic.name,
                        durable=2,
                        expiry_policy=Symbol("never"),
                        default_outcome=RELEASED,
                        outcomes=_OUTCOMES,
                    )
                    conn.accept_attach(link, source=reply, target=link.target)
                    link.context = consumer
                    subscription.add_consumer(consumer)
                    self._dispatch(subscription)
                    return
        conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no subscription named {link.name!r}"))

    def _attach_producer(self, conn: ServerConnection, link: Link) -> None:
        target = link.target
        owned = None
        node: Node | None = None
        reply = target
        if isinstance(target, Target) and target.dynamic:
            owned = self._dynamic_node(conn, target.capabilities)
            node = owned
            reply = Target(
                address=node.name,
                durable=target.durable,
                expiry_policy=target.expiry_policy,
                timeout=target.timeout,
                dynamic=True,
                dynamic_node_properties=target.dynamic_node_properties,
                capabilities=target.capabilities,
            )
        elif isinstance(target, Target) and target.address is not None:
            denied = self._denied(conn, "send", target.address, target.capabilities)
            if denied is not None:
                conn.refuse_attach(link, denied)
                return
            node = self._lookup(conn, target.address, target.capabilities)
            if node is None:
                conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {target.address!r}"))
                return
        # otherwise a null target address: the anonymous relay routes each message by its ``to``
        conn.accept_attach(link, source=link.source, target=reply)
        producer = Producer(conn, link, node)
        producer.owned_node = owned
        link.context = producer
        conn.grant_credit(link, self.settings.link_credit)

    def _attach_controller(self, conn: ServerConnection, link: Link) -> None:
        if not self.settings.permits(conn.user, "transactions", ""):
            conn.refuse_attach(link, error(Condition.UNAUTHORIZED_ACCESS, f"{conn.user!r} may not use transactions"))
            return
        source = link.source
        outcomes = source.outcomes if isinstance(source, Source) else None
        # §4.3 / DESIGN §4: errors travel as rejected when the controller offers it, or lists no outcomes
        rejects = not outcomes or _REJECTED_LIST in outcomes
        reply = Coordinator(capabilities=[Symbol(c) for c in TXN_CAPABILITIES])
        conn.accept_attach(link, source=source, target=reply)
        link.context = Controller(conn, link, rejects)
        conn.grant_credit(link, CONTROLLER_CREDIT)

    # -- detach ---------------------------------------------------------------------------------------
    def _on_detach(self, conn: ServerConnection, event: LinkDetached) -> None:
        context = event.link.context
        event.link.context = None
        if isinstance(context, Consumer):
            self._release_consumer(context)
            queue = context.queue
            if isinstance(queue, Subscription):
                queue.links -= 1
                if queue.links <= 0 and (not queue.durable or event.closed):
                    self._delete_subscription(queue)
                    if context.owned_node is None:  # a dynamic topic goes with its link, below
                        return
            if context.owned_node is not None:
                self._delete_node(context.owned_node)
                return
            self._dispatch(queue)
        elif isinstance(context, Producer):
            if context.owned_node is not None:
                self._delete_node(context.owned_node)
        elif isinstance(context, Controller):
            # §4.2 / DESIGN §4: a controller that goes away rolls back its open transactions
            self._rollback_all([t for t in self._txns.values() if t.controller is event.link])

    def _release_consumer(self, consumer: Consumer) -> None:
        """A consumer is gone: its unsettled deliveries get the default outcome (unless a transaction
        holds them: then its commit or rollback decides)."""
        consumer.queue.remove_consumer(consumer)
        consumer.txn = None
        for dispatched in list(consumer.unsettled.values()):
            if not dispatched.in_transaction:
                self._finish_delivery(dispatched, consumer.default_outcome)

    def _delete_subscription(self, subscription: Subscription) -> None:
        subscription.deleted = True
        if subscription.durable:
            self._journal_subscription(subscription, subscribed=False)
        topic = subscription.topic
        if topic.subscriptions.get(subscription.key) is subscription:
            del topic.subscriptions[subscription.key]

    def _delete_node(self, node: Node) -> None:
        """Delete a dynamic node; links still attached to it are detached (amqp:resource-deleted)."""
        queues = list(node.subscriptions.values()) if isinstance(node, Topic) else [node]
        if node.namespace is not None:
            node.namespace.remove(node)
        for queue in queues:
            queue.deleted = True
            for consumer in [*queue.consumers, *queue.browsers]:
                consumer.conn.detach(consumer.link, error(Condition.RESOURCE_DELETED, f"{node.name!r} was deleted"))
                self.dirty.add(consumer.conn)
        # senders to it too: what they sent would be accepted into a node that no longer exists
        for conn in list(node.namespace.connections if node.namespace is not None else ()):
            for session in list(conn.sessions.values()):
                for link in [k for k in session.links.values() if isinstance(k.context, Producer)]:
                    if link.context.node is node:
                        conn.detach(link, error(Condition.RESOURCE_DELETED, f"{node.name!r} was deleted"))
                        self.dirty.add(conn)

    def _on_closed(self, conn: ServerConnection, event: ConnectionClosed) -> None:
        self._rollback_all([t for t in self._txns.values() if t.conn is conn])
        self._expired.pop(conn, None)
        self.connections.discard(conn)
        namespace = self._namespace_of.pop(conn, None)
        if namespace is not None:
            namespace.connections.discard(conn)
        self.dirty.discard(conn)

    # -- credit -------------------------------------------------------------------------------------
    def _on_link_flow(self, conn: ServerConnection, event: LinkFlow) -> None:
        consumer = event.link.context
        if not isinstance(consumer, Consumer):
            return
        properties = event.properties
        if properties is not None:
            # §4.4.3: a flow carrying txn-id makes the messages sent from now on acquired under that
            # transaction; a flow with properties but no txn-id ends that (one without properties does not)
            txn_id = properties.get(_TXN_ID)
            if txn_id is None:
                consumer.txn = None
            else:
                txn = self._txn(conn, txn_id)
                if txn is None:
                    conn.detach(consumer.link, self._unknown_txn_error(conn, txn_id))
                    self.dirty.add(conn)
                    return
                consumer.txn = txn
                txn.consumers.add(consumer)
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
        context = event.link.context
        if isinstance(context, Controller):
            self._on_control(conn, context, event)
            return
        if not isinstance(context, Producer):
            return
        link = context.link
        delivery = event.delivery
        message = Message(event.payload)
        self._arrive(message)
        node = context.node
        if node is None:  # the anonymous relay
            denied = self._denied(conn, "send", message.to)
            if denied is not None:
                self._settle_incoming(conn, delivery, Rejected(error=denied))
                self._top_up(conn, link)
                return
            node = self._lookup(conn, message.to)
        state = delivery.state
        if isinstance(state, TransactionalState):
            self._post_in_transaction(conn, delivery, state.txn_id, node, message)
        elif node is None:
            self._settle_incoming(conn, delivery, Rejected(error=self._unroutable(message)))
        else:
            refused = self._admit(node, message, conn)
            if refused is not None:
                self._settle_incoming(conn, delivery, Rejected(error=refused))
            else:
                targets = self._post(node, message, conn)
                if message.durable and not delivery.settled:
                    # durable: ``accepted`` only once its journal record is on disk (group commit)
                    self._after_durable(lambda: self._settle_incoming(conn, delivery, ACCEPTED))
                else:
                    self._answer_later(conn, delivery, ACCEPTED)
                for queue in targets:
                    self._dispatch(queue)
        self._top_up(conn, link)

    def _top_up(self, conn: ServerConnection, link: Link) -> None:
        if link.credit <= self.settings.link_credit // 2:  # <=: with a credit of 1, refill at 0
            self._flush_accepts(conn)  # outcomes first, then the credit they make room for
            conn.grant_credit(link, self.settings.link_credit)

    def _flush_accepts(self, conn: ServerConnection) -> None:
        """Answer the outcomes of this batch: one disposition per run of consecutive ids with one state."""
        if self._answers:
            for state, deliveries in self._answers.values():
                conn.dispose_incoming(deliveries, state)
            self._answers = {}

    def _denied(self, conn: ServerConnection, action: str, address: Any, capabilities: Any = None) -> Any:
        """``amqp:unauthorized-access`` when the connection's user may not ``action`` on ``address``."""
        if not self.settings.permissions or not isinstance(address, str):
            return None
        name, _kind = parse_address(address, capabilities)
        if self.settings.permits(conn.user, action, name):
            return None
        return error(Condition.UNAUTHORIZED_ACCESS, f"{conn.user!r} may not {action} on {name!r}")

    def resume(self, conn: ServerConnection) -> None:
        """``conn``'s peer read what was queued for it: deliveries held back for it may go on."""
        conn.throttled = False
        queues = {
            link.context.queue
            for session in conn.sessions.values()
            for link in session.links.values()
            if isinstance(link.context, Consumer)
        }
        for queue in queues:
            self._dispatch(queue)

    def _settle_incoming(self, conn: ServerConnection, delivery: IncomingDelivery, state: Any) -> None:
        if delivery.settled:
            return
        # rcv-settle-mode second (§2.8.3): we give the outcome and settle only after the sender does
        settled = delivery.link.rcv_settle_mode != 1
        conn.dispose_incoming([delivery], state, settled=settled)

    def _on_incoming_settled(self, conn: ServerConnection, event: IncomingSettled) -> None:
        """The producer settled deliveries; nothing is held for them, so there is nothing to do."""

    def _on_delivery_updated(self, conn: ServerConnection, event: DeliveryUpdated) -> None:
        self._apply_update(conn, event.deliveries, event.state, event.settled)

    def run_durable(self, actions: list[Any], now: float) -> None:
        """Run actions whose journal records are now on disk (answers that waited for durability)."""
        self._now = now
        for action in actions:
            action()
        self.dirty.update(conn for conn in self.connections if conn.has_output)
        if self.on_change is not None:
            self.on_change()

    _HANDLERS: dict[type, Any] = {
        LinkAttached: _on_attach,
        LinkDetached: _on_detach,
        ConnectionClosed: _on_closed,
        ConnectionOpened: _on_opened,
        LinkFlow: _on_link_flow,
        SessionFlow: _on_session_flow,
        TransferReceived: _on_transfer,
        IncomingSettled: _on_incoming_settled,
        DeliveryUpdated: _on_delivery_updated,
    }


def selector_source(selector: Any) -> str | None:
    """The text of a selector (None for none), to compare subscriptions."""
    return getattr(selector, "source", None)


__all__ = ["Broker", "BrokerSettings", "LinkState"]
