"""The broker's link endpoints: attaching by decision, detaching, credit, and where each transfer goes.

Theory of operation
-------------------
An attach is answered by applying the decision ``attach.decide`` made: a receiver link becomes a
``Consumer`` of a queue, of a topic subscription, or a browser; a sender link a ``Producer`` of a node or
of the anonymous relay; a coordinator target a ``Controller``. The broker's object rides on the engine's
link as ``link.context``, given with ``accept_attach``.

A transfer on a controller link goes to the coordinator; on a producer link it is routed (the anonymous
relay looks up ``properties.to``; a link or ``to`` naming an exchange with a RabbitMQ 4 address gives the
message a ``Route`` into that exchange, with the address's routing key or the message's: ``routing_key``) and
either posted at once (``Dispatcher.publish``) or, when its state names a transaction, staged
(``Coordinator.post``; an exchange routes it at commit). A transactional relay post to an address with no node
does not create one: the node is created by the commit, so a rollback leaves nothing behind.

A link that detaches hands its unsettled deliveries to the coordinator (a transaction may hold them) and
takes with it the dynamic node it created (which only its connection may receive from:
``Nodes.receive_refusal``); deleting a node detaches every link still attached to it with
``amqp:resource-deleted``.

Broker-wide bounds are kept here, where links come and go: links attached at once (``max_links``), nodes
a peer may make (``max_nodes``), subscriptions per topic and per connection; past one, the attach (or the
relay post) is refused with ``amqp:resource-limit-exceeded``. So is the idle sweep: every half of
``auto_delete_idle`` it looks at the nodes created on demand, and deletes those found idle (empty, no link,
no transactional work, nothing arrived) at two sweeps ``auto_delete_idle`` apart.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from minibroker.amqp import definitions
from minibroker.amqp.definitions import Error, Modified, Rejected, Source, Target, TransactionalState
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Long, Symbol, Timestamp
from minibroker.broker.attach import (
    OUTCOMES,
    AttachCheck,
    AttachConsumer,
    AttachContext,
    AttachCoordinator,
    AttachDecision,
    AttachEventHub,
    AttachProducer,
    AttachService,
    Refuse,
    ResumeSubscription,
    decide,
    denied,
    fields_error,
)
from minibroker.broker.checkback import CheckLink
from minibroker.broker.clock import BrokerClock
from minibroker.broker.coordinator import Coordinator, named_transactions, transactional_work
from minibroker.broker.dispatch import ACCEPTED, Dispatcher, entity_properties, servicebus_entity
from minibroker.broker.exchanges import DEFAULT, Route, is_v2, missing_exchange, named_node, parse_v2, resource
from minibroker.broker.faults import COORDINATOR_ADDRESS, FaultRule
from minibroker.broker.injection import Injection
from minibroker.broker.links import RELEASED, Consumer, Controller, Producer
from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE, TOPIC, Namespace, Node, parse_address
from minibroker.broker.nodes import Nodes, is_servicebus_subscription
from minibroker.broker.outbox import Outbox
from minibroker.broker.personality import with_transactions
from minibroker.broker.queue import Queue
from minibroker.broker.rabbit import RabbitModel
from minibroker.broker.session_gate import SessionGate
from minibroker.broker.sessions import SessionLock, Waiter, missing_session
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import Subscription, Topic
from minibroker.broker.transactions import Deferred
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, LinkState
from minibroker.engine.events import (
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferDiscarded,
    TransferReceived,
)
from minibroker.servicebus import addresses as sb_addresses
from minibroker.servicebus import messages as sb_messages
from minibroker.servicebus import sessions as sb_sessions
from minibroker.servicebus import via as sb_via
from minibroker.servicebus.entities import key as entity_key

if TYPE_CHECKING:
    from minibroker.broker.eventhubs import EventHubs, Reader, Writer
    from minibroker.broker.management import Management
    from minibroker.broker.servicebus_links import ServiceBusLinks
    from minibroker.broker.services import ServiceLink, Services
    from minibroker.servicebus.cbs import Request

    Linked = Consumer | Producer | Controller | CheckLink | ServiceLink | Writer | Reader

_ATTACHED, _ATTACHING = LinkState.ATTACHED, LinkState.ATTACHING  # globals: ~10x cheaper than enum lookups (issue 19)

Decide = Callable[[Link, AttachContext], AttachDecision]


_LONGEST_SESSION_WAIT = 60.0
"""Seconds a receiver waits at most for the next available session (Service Bus's default operation time-out)."""


class _Entities:
    """The queue and topic names of a namespace as a container (``AttachContext.entities``), looked up on demand:
    only a Service Bus producer's attach to a plain name asks."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.namespace.node(name) is not None


class Endpoints:
    """The links of one broker, from attach to detach."""

    def __init__(
        self,
        settings: BrokerSettings,
        nodes: Nodes,
        dispatcher: Dispatcher,
        coordinator: Coordinator,
        outbox: Outbox,
        decide: Decide = decide,
        clock: BrokerClock | None = None,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.dispatcher = dispatcher
        self.coordinator = coordinator
        self.outbox = outbox
        self.decide = decide
        self.clock = clock or BrokerClock()
        # producer links of each node, detached when it goes (in the order they attached: a dict, not a set)
        self._producers: dict[Node, dict[Producer, None]] = {}
        self.links = 0
        """Links attached now on the whole broker (bounded by ``max_links``): the size of ``_linked``."""
        # the attached links of each connection: a detach counts one out once, however often it is handled
        self._linked: dict[ServerConnection, dict[Linked, None]] = {}  # (in the order they attached)
        self._topic_links: dict[ServerConnection, int] = {}  # receiver links on topics, per connection
        self._next_sweep: float | None = None
        self.injection = Injection()
        """Fault injection (set by the core): points ``attach`` and ``transfer``."""
        self._late: dict[int, TransferReceived] = {}  # transfers a ``delay`` fault held back, being taken now
        self._sb_ids = 0  # message-ids stamped on Service Bus messages that came without one
        self._servicebus: ServiceBusLinks | None = None
        # the link contexts counted in ``_linked``: the Service Bus ones join when that side is made (issue 19)
        self._linked_types: tuple[type[Linked], ...] = (Consumer, Producer, Controller, CheckLink)
        dispatcher.sessions.granted = self._session_granted
        dispatcher.sessions.wait_over = self._session_wait_over
        self.rabbit = RabbitModel(nodes, dispatcher, self.delete_node)
        """RabbitMQ's queues, exchanges and bindings (``rabbit.py``)."""

    @property
    def servicebus(self) -> ServiceBusLinks:
        """The Service Bus side (``servicebus_links.py``): ``$management``, ``$cbs``, event hubs. Made at the first
        use, a Service Bus namespace's first attach, so that other personalities never load its modules (issue
        19); a link event reaches it only once it exists (``_servicebus is not None``: no import per message)."""
        if self._servicebus is None:
            from minibroker.broker.servicebus_links import LINK_TYPES, ServiceBusLinks

            self._servicebus = ServiceBusLinks(
                self.nodes,
                self.dispatcher,
                self.outbox,
                self.clock,
                self.settings.sas_keys,
                arrival=self._servicebus_arrival,
                top_up=self._top_up,
                read=self._read_event_hub,
            )
            self._linked_types += LINK_TYPES
        return self._servicebus

    @property
    def management(self) -> Management:
        """Service Bus ``$management`` operations (``management.py``)."""
        return self.servicebus.management

    @property
    def event_hubs(self) -> EventHubs:
        """Event hubs of the ``servicebus`` personality (``eventhubs.py``)."""
        return self.servicebus.event_hubs

    @property
    def services(self) -> Services:
        """Service nodes of the ``servicebus`` personality (``$cbs``, ``ENTITY/$management``)."""
        return self.servicebus.services

    def namespace_reset(self, namespace: str) -> None:
        """``namespace`` was reset: its event hubs go (there are none before the Service Bus side exists)."""
        if self._servicebus is not None:
            self._servicebus.event_hubs.forget(namespace)

    def _context(self, conn: ServerConnection) -> AttachContext:
        remote = conn.remote_open
        container = str(remote.container_id if remote else "")
        namespace = self.nodes.namespace_of(conn)
        personality = namespace.personality
        if conn.gateway is not None:  # an AMQP 0-9-1 client: RabbitMQ serves its channel transactions
            personality = with_transactions(personality)
        if not personality.servicebus:
            return AttachContext(self.settings, conn.user, container, conn.conn_id, personality, vhost=namespace.vhost)
        hubs = self.event_hubs.of(namespace.name)
        return AttachContext(
            self.settings, conn.user, container, conn.conn_id, personality, hubs, _Entities(namespace), namespace.vhost
        )

    # -- attach -----------------------------------------------------------------------------------------
    def attached(self, conn: ServerConnection, event: LinkAttached) -> None:
        link = event.link
        decision = self.decide(link, self._context(conn))
        limit = self.settings.max_links
        if limit and self.links >= limit and not isinstance(decision, Refuse):
            decision = Refuse(error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {limit} links on this broker"))
        fault = self._attach_fault(conn, link) if self.injection.rules else None
        if fault is not None and fault.action == "refuse":
            decision = Refuse(fault.error())
        if isinstance(decision, Refuse):
            conn.refuse_attach(link, decision.error)
        elif isinstance(decision, AttachConsumer):
            self._attach_consumer(conn, link, decision)
        elif isinstance(decision, ResumeSubscription):
            self._resume_subscription(conn, link, decision)
        elif isinstance(decision, AttachProducer):
            self._attach_producer(conn, link, decision)
        elif isinstance(decision, AttachCheck):
            self._attach_check(conn, link, decision)
        elif isinstance(decision, AttachService):
            self._attach_service(conn, link, decision)
        elif isinstance(decision, AttachEventHub):
            self._attach_event_hub(conn, link, decision)
        else:
            self._attach_coordinator(conn, link, decision)
        context = link.context
        if isinstance(context, self._linked_types):
            linked = self._linked.setdefault(conn, {})
            if context not in linked:
                linked[context] = None
                self.links += 1
        if fault is not None and fault.action == "detach":
            conn.detach(link, fault.error())  # accepted, then detached at once
        self.outbox.touch(conn)

    def _attach_fault(self, conn: ServerConnection, link: Link) -> FaultRule | None:
        """Fault point ``attach``, matched on the link's address (``$coordinator`` for a coordinator)."""
        address: Any
        if isinstance(link.target, definitions.Coordinator):
            address = COORDINATOR_ADDRESS
        else:
            terminus = link.source if link.is_sender else link.target
            address = getattr(terminus, "address", None)
        return self.injection.fire("attach", conn, address if isinstance(address, str) else None)

    def links_of(self, conn: ServerConnection) -> list[Linked]:
        """``conn``'s links counted as attached (whose detach the broker has not handled)."""
        return list(self._linked.get(conn, ()))

    @property
    def topic_links(self) -> dict[ServerConnection, int]:
        """Receiver links on topics, per connection that has any (what ``max_subscriptions_per_connection`` counts)."""
        return dict(self._topic_links)

    def _lookup(
        self, conn: ServerConnection, name: str, kind: str | None, *, create: bool = True
    ) -> Node | Error | None:
        """The node ``name`` in ``conn``'s namespace, created on demand (when ``create`` and ``Nodes.creatable``:
        never in the dynamic name space) unless that would pass ``max_nodes``: then the error to refuse with."""
        node = self.nodes.lookup(conn, name, kind, create=False)
        if node is None and create and self.nodes.creatable(name):
            refusal = self.nodes.refuse_new_node()
            if refusal is not None:
                return refusal
            node = self.nodes.lookup(conn, name, kind)
        return node

    def _subscription_refusal(self, conn: ServerConnection, topic: Topic, key: tuple[str, str] | None) -> Error | None:
        """Why ``conn`` may not take one more link on ``topic`` (``key``: the subscription it names, None: an
        existing one), or None."""
        per_connection = self.settings.max_subscriptions_per_connection
        if per_connection and self._topic_links.get(conn, 0) >= per_connection:
            return error(
                Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {per_connection} topic subscriptions per connection"
            )
        per_topic = self.settings.max_subscriptions_per_topic
        if key is not None and per_topic and key not in topic.subscriptions and len(topic.subscriptions) >= per_topic:
            return error(
                Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {per_topic} subscriptions on topic {topic.name!r}"
            )
        return None

    def _count_topic_link(self, conn: ServerConnection, change: int) -> None:
        count = self._topic_links.get(conn, 0) + change
        if count > 0:
            self._topic_links[conn] = count
        else:
            self._topic_links.pop(conn, None)

    def _attach_consumer(self, conn: ServerConnection, link: Link, decision: AttachConsumer) -> None:
        source = decision.source
        if decision.name is not None and self.nodes.personality_of(conn).servicebus:
            entity, first = sb_via.top_level_entity(decision.name), _session_entity(link)
            if first is not None and entity_key(first) != entity_key(entity):
                conn.refuse_attach(link, sb_via.span_error(first, entity))  # a receive cannot go via ``first``
                return
        node: Node | None
        found: Node | Error | None
        if decision.name is None:
            found = self._dynamic_node(conn, link, "receive", source.capabilities)
            if found is None:
                return  # refused
        else:
            found = self._lookup(conn, decision.name, decision.kind, create=decision.missing is None)
        if found is None:
            found = decision.missing or error(Condition.NOT_FOUND, f"no node at address {source.address!r}")
        elif isinstance(found, Queue) and decision.kind == TOPIC and self.nodes.personality_of(conn).servicebus:
            # Service Bus: TOPIC/Subscriptions/NAME where TOPIC is a queue names no entity (``attach._resolve``)
            found = error(Condition.NOT_FOUND, f"{found.name!r} is a queue: no subscription at {source.address!r}")
        if isinstance(found, Error):
            conn.refuse_attach(link, found)
            return
        node = found
        refusal = None if source.dynamic else self.nodes.receive_refusal(conn, node)
        if refusal is not None:  # another connection's dynamic node
            conn.refuse_attach(link, refusal)
            return
        browse = decision.browse and isinstance(node, Queue)
        if isinstance(node, Queue) and not browse:
            refusal = self.rabbit.consumer_refusal(conn, node, link)
            if refusal is not None:
                conn.refuse_attach(link, refusal)
                return
        if isinstance(node, Topic):
            spec = self.nodes.named_subscription(node, decision.subscription)
            refusal = self._subscription_refusal(conn, node, spec.key)
            if refusal is not None:
                conn.refuse_attach(link, refusal)
                if source.dynamic:
                    self.delete_node(node)
                return
            no_local = conn if decision.no_local else None
            subscription = self.nodes.subscribe(node, spec, decision.selector, no_local)
            consumer = Consumer(conn, link, subscription, decision.default_outcome)
            self._count_topic_link(conn, 1)
        else:
            consumer = Consumer(conn, link, node, decision.default_outcome, selector=decision.selector, browser=browse)
        if source.dynamic:
            consumer.owned_node = node
        servicebus = consumer.servicebus = self.nodes.personality_of(conn).servicebus
        session = self._servicebus_session(consumer, decision.session) if servicebus else None
        if isinstance(session, Error):
            wait = self._session_wait(link) if str(session.condition) == sb_sessions.TIMEOUT else 0.0
            if wait > 0:  # the next available session: its attach waits for one (``sessions.py``)
                self.dispatcher.sessions.wait(consumer, decision, self.clock.now + wait)
            else:
                self._refuse_consumer(consumer, session)
            return
        self._accept_consumer(consumer, decision, session)

    def _accept_consumer(self, consumer: Consumer, decision: AttachConsumer, session: SessionLock | None) -> None:
        """Answer a consumer's attach and let it take messages (with ``session``: a Service Bus session receiver,
        the filter echoed with its session, the lock's end in .NET ticks: ``minibroker.servicebus.sessions``)."""
        conn, link, source = consumer.conn, consumer.link, decision.source
        filters, properties = decision.filters, None
        if session is not None:
            filters = {**(filters or {}), Symbol(sb_sessions.SESSION_FILTER): session.session_id}
            ticks = sb_sessions.dotnet_ticks(self.clock.wall_ms(session.until))
            properties = {Symbol(sb_sessions.LOCKED_UNTIL_UTC): Long(ticks)}
        browse = consumer.browser
        node = consumer.owned_node
        reply = Source(
            address=node.name if node is not None else source.address,
            durable=source.durable,
            expiry_policy=source.expiry_policy,
            timeout=source.timeout,
            dynamic=source.dynamic,
            dynamic_node_properties=source.dynamic_node_properties,
            distribution_mode=Symbol("copy" if browse else "move"),
            filter=filters,
            default_outcome=decision.default_outcome,
            outcomes=OUTCOMES,
            capabilities=source.capabilities,
        )
        conn.accept_attach(
            link,
            source=reply,
            target=link.target,
            properties=properties,
            context=consumer,
            rcv_settle_mode=decision.rcv_settle_mode,
            lock_tokens=consumer.servicebus,
        )
        self.dispatcher.add_consumer(consumer)
        self.rabbit.consumer_added(consumer)
        self.dispatcher.dispatch(consumer.queue)

    def _refuse_consumer(self, consumer: Consumer, refusal: Error) -> None:
        """Refuse a consumer's attach after its subscription was taken (then the link is not counted on it)."""
        queue = consumer.queue
        if isinstance(queue, Subscription):
            queue.links -= 1
            self._count_topic_link(consumer.conn, -1)
        if consumer.link.state is _ATTACHING:
            consumer.conn.refuse_attach(consumer.link, refusal)
            self.outbox.touch(consumer.conn)

    @staticmethod
    def _session_wait(link: Link) -> float:
        """How long a receiver asking for the next available session waits for one, in seconds: what its attach's
        ``com.microsoft:timeout`` property says (ms; the SDK sends its ``max_wait_time``), at most a minute; 0
        when it says nothing (then it is answered at once)."""
        properties = link.attach.properties
        wanted = properties.get(Symbol(sb_sessions.TIMEOUT)) if isinstance(properties, dict) else None
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted <= 0:
            return 0.0
        return min(wanted / 1000, _LONGEST_SESSION_WAIT)

    def _session_granted(self, waiter: Waiter, session: SessionLock) -> None:
        """A receiver waiting for the next available session got one: its attach is answered now (on its own
        connection, which may be another than the one whose message made the session available)."""
        consumer = waiter.consumer
        consumer.selector = SessionGate(session.session_id)
        assert isinstance(waiter.context, AttachConsumer)
        self._accept_consumer(consumer, waiter.context, session)
        self.outbox.touch(consumer.conn)

    def _session_wait_over(self, waiter: Waiter) -> None:
        """A receiver waited in vain for a session (or its link went away meanwhile)."""
        err = sb_sessions.error(sb_sessions.TIMEOUT, "no session became available in the time the receiver waits")
        self._refuse_consumer(waiter.consumer, err)

    def _servicebus_session(
        self, consumer: Consumer, requested: str | sb_sessions.NotRequested | None
    ) -> SessionLock | Error | None:
        """A Service Bus receiver's session (``sessions.py``): the lock of the session it asked for (or of the next
        available one), None for a plain receiver, or why its attach is refused. As Service Bus: an entity that
        requires sessions refuses plain receivers, one configured without sessions refuses session receivers (both
        ``amqp:not-allowed``). On an entity nobody configured both kinds are welcome, and a plain receiver gets
        only the messages without a session id."""
        if consumer.browser:
            return None
        queue = consumer.queue
        namespace = queue.namespace if queue.namespace is not None else self.nodes.default
        path = servicebus_entity(queue)
        configured = namespace.servicebus_entities.get(entity_key(path))
        if isinstance(requested, sb_sessions.NotRequested):
            if configured is not None and configured.requires_session:
                return sb_sessions.error(
                    sb_sessions.NOT_ALLOWED,
                    "It is not possible for an entity that requires sessions to create a non-sessionful receiver",
                )
            dead_letters = entity_key(path).endswith(entity_key("/" + sb_addresses.DEAD_LETTER_QUEUE))
            if configured is None and consumer.selector is None and not dead_letters:  # (a DLQ has no sessions)
                consumer.selector = SessionGate(None)
            return None
        if configured is not None and not configured.requires_session:
            return sb_sessions.error(
                sb_sessions.NOT_ALLOWED,
                "A sessionful receiver cannot be created on an entity that does not require sessions",
            )
        claimed = self.dispatcher.sessions.claim(consumer, requested, entity_properties(queue).lock_duration)
        if isinstance(claimed, SessionLock):
            consumer.selector = SessionGate(claimed.session_id)
        return claimed

    def _dynamic_node(self, conn: ServerConnection, link: Link, action: str, capabilities: Any) -> Node | None:
        """A dynamic node for ``link``, when its user may ``action`` ("receive" for a dynamic source, "send" for
        a dynamic target) on the address generated for it and ``max_nodes`` leaves room; else the attach is refused
        (unauthorized-access, resource-limit-exceeded)."""
        name = self.nodes.dynamic_name(conn)
        refusal = denied(self._context(conn), action, name) or self.nodes.refuse_new_node()
        if refusal is not None:
            conn.refuse_attach(link, refusal)
            return None
        return self.nodes.dynamic(conn, capabilities, name)

    def _resume_subscription(self, conn: ServerConnection, link: Link, decision: ResumeSubscription) -> None:
        subscription = self.nodes.durable_subscription(conn, decision.link_name)
        if subscription is None:
            conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no subscription named {decision.link_name!r}"))
            return
        refusal = denied(self._context(conn), "receive", subscription.topic.name)
        refusal = refusal or self.nodes.receive_refusal(conn, subscription.topic)
        if refusal is None:  # (found by name alone: the topic's permission still applies)
            refusal = self._subscription_refusal(conn, subscription.topic, None)
        if refusal is not None:
            conn.refuse_attach(link, refusal)
            return
        subscription.links += 1
        self._count_topic_link(conn, 1)
        consumer = Consumer(conn, link, subscription, RELEASED)
        reply = Source(
            address=subscription.topic.name,
            durable=2,
            expiry_policy=Symbol("never"),
            default_outcome=RELEASED,
            outcomes=OUTCOMES,
        )
        conn.accept_attach(link, source=reply, target=link.target, context=consumer)
        self.dispatcher.add_consumer(consumer)
        self.dispatcher.dispatch(subscription)

    def _attach_producer(self, conn: ServerConnection, link: Link, decision: AttachProducer) -> None:
        target = decision.target
        reply = target
        node: Node | None = None
        if decision.dynamic:
            node = self._dynamic_node(conn, link, "send", target.capabilities)
            if node is None:
                return
            reply = Target(
                address=node.name,
                durable=target.durable,
                expiry_policy=target.expiry_policy,
                timeout=target.timeout,
                dynamic=True,
                dynamic_node_properties=target.dynamic_node_properties,
                capabilities=target.capabilities,
            )
        elif decision.name is not None:
            # a via-sender's via entity must exist or be creatable, as its destination must
            via = None if decision.via is None else self._lookup(conn, *decision.via)
            found: Node | Error | None = via if isinstance(via, Error) else None
            if found is None:
                found = self._lookup(conn, decision.name, decision.kind, create=decision.missing is None)
            if found is None or (via is None and decision.via is not None):
                found = decision.missing or error(Condition.NOT_FOUND, f"no node at address {target.address!r}")
            if isinstance(found, Error):
                conn.refuse_attach(link, found)
                return
            node = found
        if decision.exchange is not None:
            refused = self._exchange_route(conn, decision.exchange, "", None)
            if isinstance(refused, Error):
                conn.refuse_attach(link, refused)
                return
        producer = Producer(conn, link, node, decision.exchange, decision.route)
        if self.nodes.personality_of(conn).servicebus:
            producer.servicebus = True
            entity = decision.via[0] if decision.via is not None else node.name if node is not None else None
            producer.entity = _session_entity(link) or (None if entity is None else sb_via.top_level_entity(entity))
        if decision.dynamic:
            producer.owned_node = node
        # what a transfer naming at most one state makes the broker do (post or stage it, answer, top up credit)
        # never changes how the next frame reads: the engine may parse a read's run of them in one go (one whose
        # frames name two transactions detaches controllers, so it is handled before the next frame is read)
        conn.accept_attach(
            link,
            source=link.source,
            target=reply,
            context=producer,
            read_ahead=True,
            rcv_settle_mode=decision.rcv_settle_mode,
            settle_at_once=decision.settle_at_once,
        )
        if node is not None:
            self._producers.setdefault(node, {})[producer] = None
        conn.grant_credit(link, self.settings.link_credit)

    def _attach_coordinator(self, conn: ServerConnection, link: Link, decision: AttachCoordinator) -> None:
        personality = self.nodes.personality_of(conn)
        controller = Controller(conn, link, decision.rejects_errors, personality, check_back=decision.check_back)
        conn.accept_attach(link, source=decision.source, target=decision.target, context=controller)
        conn.grant_credit(link, personality.controller_credit)

    def _attach_check(self, conn: ServerConnection, link: Link, decision: AttachCheck) -> None:
        """A ``$txn-check`` link (``checkback.py``): checks and answers go out on an outgoing one, outcomes and
        queries come in on an incoming one."""
        remote = conn.remote_open
        key = (self.nodes.namespace_of(conn).name, str(remote.container_id) if remote is not None else "")
        check = CheckLink(conn, link, key, outgoing=decision.outgoing)
        conn.accept_attach(link, source=link.source, target=link.target, context=check)
        if not decision.outgoing:
            conn.grant_credit(link, self.settings.link_credit)
        self.coordinator.check_back.attached(check)

    def _attach_service(self, conn: ServerConnection, link: Link, decision: AttachService) -> None:
        """A link to or from a Service Bus service node (``services.py``)."""
        from minibroker.broker.services import ServiceLink  # loaded with ``self.servicebus`` (in ``_context``)

        service = ServiceLink(conn, link, decision.node, outgoing=decision.outgoing)
        conn.accept_attach(link, source=link.source, target=link.target, context=service)
        if not decision.outgoing:
            conn.grant_credit(link, self.settings.link_credit)
        self.services.attached(service)

    def _read_event_hub(self, conn: ServerConnection, request: Request) -> bytes:
        """An Event Hubs ``READ`` on ``conn``: of a hub of its namespace (``EventHubs.read``)."""
        return self.event_hubs.read(self.nodes.namespace_of(conn).name, request)

    def _attach_event_hub(self, conn: ServerConnection, link: Link, decision: AttachEventHub) -> None:
        """A link to an event hub or from one of its partitions (``eventhubs.py``)."""
        from minibroker.broker.eventhubs import Writer  # loaded with ``self.servicebus`` (in ``_context``)

        hubs = self.event_hubs
        namespace = self.nodes.namespace_of(conn).name
        if decision.address.consumer_group is None:
            context: Writer | Reader | Error = hubs.writer(conn, link, namespace, decision.address)
        else:
            context = hubs.reader(conn, link, namespace, decision.address, decision.selector)
        if isinstance(context, Error):
            conn.refuse_attach(link, context)
            return
        conn.accept_attach(
            link, source=link.source, target=link.target, context=context, settle_at_once=isinstance(context, Writer)
        )
        if isinstance(context, Writer):
            conn.grant_credit(link, self.settings.link_credit)
        else:
            hubs.flow(context)

    # -- detach -----------------------------------------------------------------------------------------
    def detached(self, conn: ServerConnection, event: LinkDetached) -> None:
        context = event.link.context
        if isinstance(context, self._linked_types):
            linked = self._linked.get(conn)
            if linked is not None and context in linked:
                del linked[context]
                self.links -= 1
                if not linked:
                    del self._linked[conn]
        if isinstance(context, Consumer):
            self._consumer_detached(context, closed=event.closed)
        elif isinstance(context, Producer):
            if context.node is not None:
                producers = self._producers.get(context.node)
                if producers is not None:
                    producers.pop(context, None)
                    if not producers:
                        del self._producers[context.node]
            if context.owned_node is not None:
                self.delete_node(context.owned_node)
        elif isinstance(context, Controller):
            self.coordinator.controller_gone(context)
        elif isinstance(context, CheckLink):
            self.coordinator.check_back.detached(context)
        elif self._servicebus is not None:  # $cbs, $management, event hubs: once a Service Bus link attached
            self._servicebus.detached(context)

    def _consumer_detached(self, consumer: Consumer, *, closed: bool) -> None:
        self.dispatcher.remove_consumer(consumer)
        self.coordinator.consumer_gone(consumer)
        self.rabbit.consumer_gone(consumer)
        queue = consumer.queue
        if isinstance(queue, Subscription):
            self._count_topic_link(consumer.conn, -1)
            queue.links -= 1
            # Service Bus: the SDKs close a receiver (closed=true); its subscription, an entity, stays
            ending = not queue.durable or (closed and not is_servicebus_subscription(queue.topic, queue.key))
            if queue.links <= 0 and ending:
                self.nodes.unsubscribe(queue)
                if consumer.owned_node is None:  # a dynamic topic goes with its link, below
                    return
        if consumer.owned_node is not None:
            self.delete_node(consumer.owned_node)
            return
        self.dispatcher.dispatch(queue)

    def delete_node(self, node: Node) -> None:
        """Delete a node: links still attached to it are detached with ``amqp:resource-deleted`` (its
        consumers' unsettled deliveries and a transaction's posts to it are settled when they detach or
        discharge: a commit of a transaction that posted to it fails)."""
        for queue in self.nodes.delete(node):
            self.dispatcher.queue_deleted(queue)
        err = error(Condition.RESOURCE_DELETED, f"{node.name!r} was deleted")
        for producer in self._producers.pop(node, ()):
            producer.conn.detach(producer.link, err)
            self.outbox.touch(producer.conn)

    # -- credit -----------------------------------------------------------------------------------------
    def flow(self, conn: ServerConnection, event: LinkFlow) -> None:
        consumer = event.link.context
        if not isinstance(consumer, Consumer):
            if isinstance(consumer, CheckLink):
                self.coordinator.check_back.flow(consumer)
            elif self._servicebus is not None:
                self._servicebus.flow(consumer)
            return
        if event.properties is not None:
            err = self.coordinator.flow(conn, consumer, event.properties)
            if err is None and self.nodes.personality_of(conn).strict:
                err = fields_error(event.properties, "the flow's properties")
            if err is not None:
                conn.detach(consumer.link, err)
                self.outbox.touch(conn)
                return
        self.dispatcher.dispatch(consumer.queue)
        # what is left for the link, in the flow that ends a drain or answers an echo (the engine sends it next)
        conn.set_available(consumer.link, self.dispatcher.available(consumer))
        if consumer.link.drain:
            conn.complete_drain(consumer.link)
            self.outbox.touch(conn)

    def session_flow(self, conn: ServerConnection, event: SessionFlow) -> None:
        session = event.session
        consumers = self.dispatcher.consumers_of(conn)
        self.dispatcher.dispatch_all({c.queue for c in consumers if c.link.session is session})

    # -- messages in --------------------------------------------------------------------------------------
    def transfer(self, conn: ServerConnection, event: TransferReceived) -> None:
        context = event.link.context
        if isinstance(context, Controller):
            self.coordinator.control(conn, context, event)
            return
        if not isinstance(context, Producer):
            if isinstance(context, CheckLink):
                self.coordinator.check_message(conn, context, event)
                self._top_up(conn, context.link)
            elif self._servicebus is not None:
                self._servicebus.transfer(conn, context, event)
            return
        if self.injection.rules and self._transfer_fault(conn, context, event):
            return
        delivery = event.delivery
        payload = event.payload
        servicebus = context.servicebus  # (read once: every transfer asks three times, issue 19)
        if servicebus:
            if event.message_format == sb_messages.BATCH_FORMAT and self._servicebus_batch(conn, context, event):
                return
            payload = self._servicebus_arrival(payload)
        message = Message(payload, limit=self.settings.max_selector_properties_size or None)
        # ``transactional_work`` inline: every transfer asks (frames that carry different states, none naming a
        # transaction, are no transactional work, §4.4.1)
        transactional = isinstance(delivery.state, TransactionalState) or (
            bool(delivery.earlier_states) and bool(named_transactions(delivery))
        )
        if message.content.malformed is not None:  # (the field itself: every transfer asks, issue 19)
            # Part 3 §3.2: the broker reads the header and annotations (durability, ttl, priority, delivery-count,
            # scheduling); when they do not decode it cannot keep its promises for the message, so it refuses it
            # (§2.8.15 decode-error): rejected, or dropped when pre-settled, like any refused pre-settled post
            undecodable = (
                error(Condition.RESOURCE_LIMIT_EXCEEDED, f"the message's {message.malformed}")
                if message.oversized
                else error(
                    Condition.DECODE_ERROR, f"the message's header or annotations do not decode: {message.malformed}"
                )
            )
            self._refuse_post(conn, context.link, delivery, message, transactional, undecodable)
            return
        if servicebus:
            self.dispatcher.servicebus_arrive(context.node, message)
        else:
            self.dispatcher.arrive(message)
        target: Node | Route | Deferred | None = context.node
        if servicebus and isinstance(target, Queue):
            refusal = missing_session(entity_properties(target).requires_session, message)
            if refusal is not None:
                self._refuse_post(conn, context.link, delivery, message, transactional, refusal)
                return
        if context.exchange is not None:  # a link to an exchange: each message is routed by it
            found = self._exchange_route(conn, context.exchange, context.route, message)
            if isinstance(found, Error):
                self._refuse_post(conn, context.link, delivery, message, transactional, found)
                return
            target = found
        elif target is None:  # the anonymous relay routes by ``to``
            to = message.to
            unreadable = message.undecodable_properties() if to is None else None
            if unreadable is not None:
                # the address is in a properties section that does not decode (§2.8.15 decode-error), which is
                # no "no node at address None"
                err = error(Condition.DECODE_ERROR, f"the message's properties do not decode: {unreadable}")
                self._refuse_post(conn, context.link, delivery, message, transactional, err)
                return
            refusal = denied(self._context(conn), "send", to) if self.settings.permissions else None
            routed = self._relay_target(conn, to, transactional, message) if refusal is None else None
            if isinstance(routed, Error):  # no room for the node it would create
                refusal = routed
            if refusal is not None:
                self._refuse_post(conn, context.link, delivery, message, transactional, refusal)
                return
            assert not isinstance(routed, Error)
            target = routed
        if transactional:
            # Service Bus: the entity it is work on, its link's (a via-sender's via entity) or the one it reaches
            entity = context.entity
            if entity is None and servicebus and target is not None:
                entity = sb_via.top_level_entity(target.name)
            self.coordinator.post(conn, delivery, target, message, entity=entity)
        elif target is None:
            refusal = error(Condition.NOT_FOUND, f"no node at address {message.to!r}")
            self.outbox.answer_now(conn, delivery, Rejected(error=refusal))
        else:
            assert not isinstance(target, Deferred)
            self.dispatcher.publish(conn, delivery, target, message)
        self._top_up(conn, context.link)

    def _servicebus_arrival(self, payload: bytes) -> bytes:
        """A message as a Service Bus entity takes it: ``x-opt-enqueued-time`` annotated, a message-id stamped
        when it has none (``minibroker.servicebus.messages``), durable (Service Bus stores every message: with a
        data directory it is journaled, as the SDKs send it non-durable). A malformed one is left as it is (then
        refused)."""
        message = Message(payload, limit=self.settings.max_selector_properties_size or None)
        if message.malformed is not None:
            return payload
        rest = None
        if sb_messages.message_id_missing(payload, message.properties_start):
            self._sb_ids += 1
            hexed = f"{self._sb_ids:032x}"
            message_id = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
            rest = sb_messages.with_message_id(payload, message.properties_start, message_id)
        return message.rewritten({"x-opt-enqueued-time": Timestamp(self.clock.wall_ms())}, rest, durable=True)

    def _servicebus_batch(self, conn: ServerConnection, producer: Producer, event: TransferReceived) -> bool:
        """A Service Bus batch (message-format 0x80013700) to a node, outside a transaction: each message in it
        posted on its own, the transfer answered once (rejected with the first refusal). False when it is not such
        a batch (then it is taken as one message)."""
        parts = sb_messages.split_batch(event.payload)
        node = producer.node
        if parts is None or node is None or transactional_work(event.delivery):
            return False
        refusal: Error | None = None
        for part in parts:
            message = Message(self._servicebus_arrival(part), limit=self.settings.max_selector_properties_size or None)
            if message.malformed is not None:
                refusal = refusal or error(Condition.DECODE_ERROR, f"a message of the batch: {message.malformed}")
                continue
            self.dispatcher.servicebus_arrive(node, message)
            missing = (
                missing_session(entity_properties(node).requires_session, message) if isinstance(node, Queue) else None
            )
            if missing is not None:
                refusal = refusal or missing
                continue
            refusal = self.dispatcher.inject(node, message) or refusal
        self.outbox.answer_now(conn, event.delivery, ACCEPTED if refusal is None else Rejected(error=refusal))
        self._top_up(conn, producer.link)
        return True

    def _transfer_fault(self, conn: ServerConnection, producer: Producer, event: TransferReceived) -> bool:
        """Fault point ``transfer`` (a message arriving for the rule's address: the node's name, or the ``to`` of a
        message for the anonymous relay); whether a rule fired and took the transfer."""
        if self._late.pop(id(event), None) is not None:
            return False  # held back by a ``delay`` fault: taken now
        node = producer.node
        message = Message(event.payload, limit=self.settings.max_selector_properties_size or None)
        address = node.name if node is not None else producer.exchange or message.to
        rule = self.injection.fire("transfer", conn, named_node(address) if isinstance(address, str) else None)
        if rule is None:
            return False
        link, delivery = producer.link, event.delivery
        action = rule.action
        if action == "drop-connection":
            self.injection.drop(conn)
            return True
        if action == "delay":
            if transactional_work(delivery):
                self.coordinator.hold_post(conn, delivery, 1)
            self.injection.later(rule.delay, partial(self._late_take, conn, producer, event))
            return True
        if action == "reject":
            self._refuse_post(conn, link, delivery, message, transactional_work(delivery), rule.error())
            return True
        self.outbox.answer_now(conn, delivery, RELEASED if action == "release" else Modified(delivery_failed=True))
        self._top_up(conn, link)
        return True

    def _late_take(self, conn: ServerConnection, producer: Producer, event: TransferReceived) -> None:
        """A transfer a ``delay`` fault held back, taken now (unless its link went meanwhile)."""
        if transactional_work(event.delivery):
            self.coordinator.hold_post(conn, event.delivery, -1)
        if producer.link.state is _ATTACHED and not conn.finished:
            self._late[id(event)] = event
            self.transfer(conn, event)
            self.outbox.flush(conn)  # its answer goes now: no read of ``conn`` ends this step

    def _refuse_post(
        self,
        conn: ServerConnection,
        link: Link,
        delivery: IncomingDelivery,
        message: Message,
        transactional: bool,
        refusal: Error,
    ) -> None:
        """Refuse a post: rejected (nothing to tell when pre-settled), and when transactional, so is the commit of
        the transaction it names; the credit it used is made good."""
        if transactional:
            self.coordinator.post(conn, delivery, None, message, refusal)
        else:
            self.outbox.answer_now(conn, delivery, Rejected(error=refusal))
        self._top_up(conn, link)

    def transfer_discarded(self, conn: ServerConnection, event: TransferDiscarded) -> None:
        """A transfer the engine discarded before it was whole: a transaction it was posted in cannot commit
        (unless its sender aborted it: then it never was work of the transaction), and the credit it used is
        made good."""
        if not event.aborted:
            self.coordinator.discarded(conn, event.states)
        link = event.link
        if link is None or link.state is not _ATTACHED:
            return
        if isinstance(link.context, Producer):
            self._top_up(conn, link)
        elif isinstance(link.context, Controller):
            self.coordinator.replenish(conn, link.context, answered=True)  # its credit comes back, as an answer's would

    def _relay_target(
        self, conn: ServerConnection, to: object, transactional: bool, message: Message
    ) -> Node | Route | Deferred | Error | None:
        """The node the anonymous relay routes ``to`` to (a RabbitMQ 4 address: its queue, never created, or its
        exchange, missing: ``amqp:not-found``); a transactional post to an address with no node gets a ``Deferred``
        one, created by the commit; an error when the node would pass ``max_nodes``."""
        if not to or not isinstance(to, str):
            return None
        personality = self.nodes.personality_of(conn)
        if personality.addresses == "rabbitmq" or (not personality.servicebus and is_v2(to)):
            found = parse_v2(to, source=False)
            if isinstance(found, Error):
                return None
            if found.exchange is not None:
                return self._exchange_route(conn, found.exchange, found.key, message)
            assert found.queue is not None
            return self.nodes.lookup(conn, found.queue, QUEUE, create=False)
        name, kind = parse_address(to)
        node = self._lookup(conn, name, kind, create=not transactional)
        if node is None and transactional and self.nodes.creatable(name):
            return self.nodes.refuse_new_node() or Deferred(self.nodes.namespace_of(conn), name, kind)
        return node

    def _exchange_route(
        self, conn: ServerConnection, name: str, key: str | None, message: Message | None
    ) -> Route | Error:
        """The way of ``message`` into exchange ``name`` of ``conn``'s namespace with routing key ``key`` (None: the
        message's own, ``routing_key``); ``amqp:not-found`` when there is no such exchange, and
        ``amqp:unauthorized-access`` for an internal one (rabbit_amqp_session.erl ``check_internal_exchange``). A
        message that does not name its exchange (a 1.0 publish; the 0-9-1 gateway's do) is annotated with
        ``x-exchange`` and ``x-routing-key``, as RabbitMQ 4 annotates what it routes (mc_amqp.erl
        ``protocol_state_message_annotations``), so a 0-9-1 consumer sees where it was published (an empty key is
        left out: dead-lettering then takes the queue's name, ``dispatch.dead_letter_exchange``)."""
        namespace = self.nodes.namespace_of(conn)
        exchange = namespace.exchanges.get(name)
        if exchange is None:
            return missing_exchange(name if name != DEFAULT else "amq.default", namespace.vhost)
        if exchange.internal:
            text = f"forbidden to publish to internal {resource('exchange', name, namespace.vhost)}"
            return error(Condition.UNAUTHORIZED_ACCESS, text)
        if key is None:
            key = routing_key(message) if message is not None else ""
        route = Route(namespace, exchange, key)
        if message is not None and not isinstance(
            message.annotation("x-exchange") if message.annotations else None, str
        ):
            message.annotate({"x-exchange": name, "x-routing-key": key} if key else {"x-exchange": name})
        return route

    # -- idle nodes created on demand ----------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When the idle sweep next runs (only while there are nodes created on demand and it is on)."""
        period = self.settings.auto_delete_idle
        if not period or not self.nodes.auto_nodes:
            self._next_sweep = None
            return None
        if self._next_sweep is None:
            self._next_sweep = self.clock.now + period / 2
        return self._next_sweep

    def handle_timeout(self, now: float) -> None:
        """Run the idle sweep if it is due: delete the nodes created on demand that were found idle at two
        sweeps ``auto_delete_idle`` apart (and idle every time in between)."""
        period = self.settings.auto_delete_idle
        if self._next_sweep is None or now < self._next_sweep or not period:
            return
        self._next_sweep = now + period / 2
        auto = self.nodes.auto_nodes
        for node in list(auto):
            if node.deleted:
                del auto[node]
            elif not self._idle(node):
                node.idle_since = None
            elif node.idle_since is None or node.idle_mark != self._use_mark(node):
                node.idle_since, node.idle_mark = now, self._use_mark(node)
            elif now - node.idle_since >= period:
                del auto[node]
                self.delete_node(node)

    @staticmethod
    def _use_mark(node: Node) -> int:
        """A count that moves whenever a message reaches ``node``."""
        return node.published_total if isinstance(node, Topic) else node.enqueued_total

    def _idle(self, node: Node) -> bool:
        """Empty, no link, no transactional work pending on it."""
        if node.staged or node in self._producers:
            return False
        if isinstance(node, Topic):
            return not node.subscriptions
        return not (node.held or node.ready or self.dispatcher.has_links(node))

    def _top_up(self, conn: ServerConnection, link: Link) -> None:
        if link.credit <= self.settings.link_credit // 2:  # <=: with a credit of 1, refill at 0
            self.outbox.flush(conn)  # outcomes first, then the credit they make room for
            conn.grant_credit(link, self.settings.link_credit)
            self.outbox.touch(conn)


def _session_entity(link: Link) -> str | None:
    """The entity every send of ``link``'s session goes via, when it is a Service Bus cross-entity session: its
    first link is a coordinator (Azure.Messaging.ServiceBus ``EnableCrossEntityTransactions``: one session, the
    controller opened first "to let the service know that there will be cross entity transactions on this
    session", ``Amqp/AmqpConnectionScope.cs``); the entity is that of its first sender or receiver
    (``samples/Sample06_Transactions.md``). None: no such session, or no entity used on it yet."""
    links = iter(link.session.links.values())
    first = next(links, None)
    if first is None or not isinstance(first.context, Controller):
        return None
    for other in links:
        context = other.context
        if isinstance(context, Producer) and context.entity is not None:
            return context.entity
        if isinstance(context, Consumer) and context.servicebus:
            return sb_via.top_level_entity(servicebus_entity(context.queue))
    return None


def routing_key(message: Message) -> str:
    """The routing key of a message sent to an exchange address without one: its ``x-routing-key`` annotation
    (what the 0-9-1 gateway stamps), else its subject (RabbitMQ 4: ``/exchanges/NAME`` routes by the subject),
    else the empty key."""
    annotated = message.annotation("x-routing-key") if message.annotations else None
    if isinstance(annotated, str):
        return annotated
    properties = message.properties()
    subject = properties.subject if properties is not None else None
    return subject if isinstance(subject, str) else ""
