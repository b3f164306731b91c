"""Nodes and namespaces: which queues and topics exist, where each connection works, and node lifetimes.

A node is created by configuration (in every namespace, at its creation), on demand (an attach to an unknown
address, when auto-create is on), as a dynamic node for a link asking for one (§3.5.3; deleted with its
link), or as a dead-letter or expiry address. Topic subscriptions are created and deleted here too. Every
queue that keeps its messages across restarts is handed to the journal recorder when it is created. A node is
never created over another of the same name.

Dynamic nodes (Part 3 §3.5.3 source/target ``dynamic``: "the receiving link endpoint [...] MUST generate the
address") get ``dynamic.<connection>.<random>``: unpredictable, and unique among the namespace's nodes. Nobody
else may make a node in that name space (an attach or relay post to an unknown ``dynamic.`` address finds no
node rather than creating one), so a generated address always names the dynamic node it was generated for.

Not here: what happens to the links of a node that is deleted (``endpoints.py``), or to the messages in it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.broker.exchanges import predeclared
from minibroker.broker.namespace import DEFAULT_NAMESPACE, QUEUE, TOPIC, Namespace, Node, parse_address
from minibroker.broker.personality import Personality
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import Recorder
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import Subscription, Topic, shared_subscription_name
from minibroker.engine.connection import ServerConnection
from minibroker.servicebus.entities import key as entity_key

DYNAMIC_PREFIX = "dynamic."
"""The name space of generated addresses (``dynamic_name``)."""

if TYPE_CHECKING:  # the selector module is imported only by brokers that see a selector
    from minibroker.broker.selector import Selector


class SubscriptionSpec(NamedTuple):
    """Which subscription of a topic an attach names, and how it behaves (see ``topic.py``)."""

    key: tuple[str, str]
    durable: bool
    shared: bool

    @classmethod
    def servicebus(cls, name: str) -> SubscriptionSpec:
        """Service Bus: ``TOPIC/Subscriptions/NAME`` is one durable subscription that all its receivers share."""
        return cls(("", name), durable=True, shared=True)


class Nodes:
    """The namespaces of one broker, their nodes, and the namespace of each connection."""

    def __init__(self, settings: BrokerSettings, recorder: Recorder, dynamic_ids: Iterator[str] | None = None) -> None:
        self.settings = settings
        self.recorder = recorder
        self._dynamic_ids = dynamic_ids if dynamic_ids is not None else _random_ids()
        self.namespaces: dict[str, Namespace] = {}
        self.connections: dict[ServerConnection, None] = {}  # (an ordered set: in the order they came)
        self._namespace_of: dict[ServerConnection, Namespace] = {}
        self.queue_gone: Callable[[Queue], None] = lambda queue: None
        self.auto_nodes: dict[Node, None] = {}
        """Nodes created on demand, oldest first, while ``auto_delete_idle`` is on (the idle sweep's to look at)."""
        self.first_auto_node: Callable[[], None] = lambda: None
        """Told when a node created on demand appears while there was none (the idle sweep starts ticking)."""
        """Told when a queue is deleted (the dispatcher's timers forget what they held for it)."""
        self.default = self.namespace(DEFAULT_NAMESPACE)

    # -- namespaces -----------------------------------------------------------------------------------
    def namespace(self, name: str, personality: Personality | None = None) -> Namespace:
        """The namespace called ``name``, created (with the configured nodes and ``personality``, by default the
        broker's) if needed; an existing one keeps its personality."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            namespace = self.namespaces[name] = Namespace(name, personality or self.settings.personality)
            self.populate(namespace)
        return namespace

    def personality_of(self, conn: ServerConnection) -> Personality:
        """The personality of the namespace ``conn`` works in."""
        return self.namespace_of(conn).personality

    def populate(self, namespace: Namespace) -> None:
        """Create the configured nodes in ``namespace`` (a name configured as both is a topic: ``policy_for``), and
        in a ``servicebus`` namespace the declared Service Bus entities with their properties."""
        for name in [*self.settings.queues, *self.settings.topics]:
            if namespace.node(name) is None:
                self.create(namespace, name, None)
        declared = self.settings.servicebus
        if declared and namespace.personality.servicebus:
            namespace.servicebus_entities = declared.entities()
            for names, kind in ((declared.queues, QUEUE), (declared.topics, TOPIC)):
                for name in names:
                    if namespace.node(name) is None:
                        self.create(namespace, name, kind)
            for topic_name, name in declared.subscriptions:
                topic = namespace.topics.get(topic_name)
                if topic is not None:
                    self.servicebus_subscription(topic, name)

    def connection_made(self, conn: ServerConnection, namespace: Namespace | None) -> None:
        namespace = namespace or self.default
        self.connections[conn] = None
        namespace.connections[conn] = None
        self._namespace_of[conn] = namespace

    def connection_opened(self, conn: ServerConnection, hostname: str | None) -> None:
        """An ``open`` whose hostname names a namespace moves its connection there."""
        chosen = self.namespaces.get(hostname) if hostname else None
        if chosen is not None:
            self._namespace_of[conn].connections.pop(conn, None)
            chosen.connections[conn] = None
            self._namespace_of[conn] = chosen

    def connection_closed(self, conn: ServerConnection) -> None:
        self.connections.pop(conn, None)
        namespace = self._namespace_of.pop(conn, None)
        if namespace is not None:
            namespace.connections.pop(conn, None)

    def namespace_of(self, conn: ServerConnection) -> Namespace:
        """The namespace ``conn`` works in."""
        return self._namespace_of.get(conn, self.default)

    # -- nodes ----------------------------------------------------------------------------------------
    def create(self, namespace: Namespace, name: str, kind: str | None, *, auto: bool = False) -> Node:
        """Create a node; the configuration decides its kind and policy, else ``kind``, else a queue. ``auto``:
        created on demand (an attach, a relay post, a dead-letter), so deleted once idle (``auto_delete_idle``)
        unless it is configured. A node of that name must not exist: one is never silently replaced."""
        if namespace.node(name) is not None:
            raise ValueError(f"a node named {name!r} already exists in namespace {namespace.name!r}")
        configured, policy = self.settings.policy_for(name)
        node: Node
        if (configured or kind) == TOPIC:
            node = namespace.topics[name] = Topic(name, policy)
        else:
            node = namespace.queues[name] = Queue(name, policy)
            self.recorder.adopt(node)
        node.namespace = namespace
        node.auto = auto and configured is None
        if node.auto and self.settings.auto_delete_idle:
            self.auto_nodes[node] = None
            if len(self.auto_nodes) == 1:
                self.first_auto_node()
        return node

    def node_count(self) -> int:
        """Nodes of every namespace (O(namespaces))."""
        return sum(len(ns.queues) + len(ns.topics) for ns in self.namespaces.values())

    def refuse_new_node(self, extra: int = 0) -> Error | None:
        """``amqp:resource-limit-exceeded`` when a peer may not make one more node (after ``extra`` others)."""
        limit = self.settings.max_nodes
        if limit and self.node_count() + extra >= limit:
            return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {limit} nodes on this broker")
        return None

    def queue(self, name: str, namespace: Namespace | None = None) -> Queue:
        """The queue called ``name`` (in the default namespace unless told), created if needed."""
        namespace = namespace or self.default
        node = namespace.node(name) or self.create(namespace, name, QUEUE)
        assert isinstance(node, Queue), f"{name!r} is a topic"
        return node

    def lookup(self, conn: ServerConnection, name: str, kind: str | None, *, create: bool = True) -> Node | None:
        """The node ``name`` in ``conn``'s namespace, created (as ``kind``) when ``create`` and ``creatable``."""
        namespace = self.namespace_of(conn)
        node = namespace.node(name)
        if node is None and create and self.creatable(name):
            node = self.create(namespace, name, kind, auto=True)
        return node

    def creatable(self, name: str) -> bool:
        """Whether a peer's attach or relay post to ``name``, which names no node, may create one: when auto-create
        is on, and never in the dynamic name space (only the broker makes nodes there, with ``dynamic``)."""
        return self.settings.auto_create and not name.startswith(DYNAMIC_PREFIX)

    def dynamic_name(self, conn: ServerConnection) -> str:
        """A fresh generated address for a dynamic node of ``conn`` (§3.5.3): ``dynamic.<connection>.<random>``,
        unguessable (128 random bits, unless the broker was given ``dynamic_ids``) and naming no node of
        ``conn``'s namespace."""
        namespace = self.namespace_of(conn)
        while True:
            name = f"{DYNAMIC_PREFIX}{conn.conn_id}.{next(self._dynamic_ids)}"
            if namespace.node(name) is None:
                return name

    def dynamic(self, conn: ServerConnection, capabilities: Any, name: str | None = None) -> Node:
        """A node with a generated address (``name``, or a fresh one) for a dynamic terminus (§3.5.3), deleted
        with its link; ``conn`` owns it: only its links may receive from it (``receive_refusal``)."""
        _, kind = parse_address("", capabilities)
        name = name if name is not None else self.dynamic_name(conn)
        node = self.create(self.namespace_of(conn), name, kind)
        node.dynamic = True
        node.owner = conn
        return node

    @staticmethod
    def receive_refusal(conn: ServerConnection, node: Node) -> Error | None:
        """``amqp:unauthorized-access`` when ``conn`` may not attach a receiver to ``node``: a dynamic node is
        received from only by the connection that created it (as a JMS temporary destination); anyone who knows
        its address may send to it (request/reply)."""
        if node.dynamic and node.owner is not conn:
            return error(
                Condition.UNAUTHORIZED_ACCESS,
                f"{node.name!r} is a dynamic node of another connection: only that connection may receive from it",
            )
        return None

    def keep(self, node: Node) -> None:
        """``node`` was created on demand but is now declared (a RabbitMQ ``queue.declare`` or ``queue.bind``): it
        lives until deleted, out of the idle sweep's reach."""
        node.auto = False
        self.auto_nodes.pop(node, None)

    def delete(self, node: Node) -> list[Queue]:
        """Delete ``node`` (a dynamic node whose link went away, an idle one); returns the queues that went with
        it."""
        queues: list[Queue] = list(node.subscriptions.values()) if isinstance(node, Topic) else [node]
        if node.namespace is not None:
            node.namespace.remove(node)
        node.deleted = True
        self.auto_nodes.pop(node, None)
        for queue in queues:
            self._drop(queue)
        return queues

    def _drop(self, queue: Queue) -> None:
        """A queue (or subscription) is deleted: its ready messages go with it."""
        queue.drop()
        self.queue_gone(queue)

    def reset(self, namespace: Namespace) -> None:
        """Drop every node of ``namespace`` and create the configured ones afresh (its connections are
        already closed)."""
        auto = self.auto_nodes
        for queue in namespace.queues.values():
            queue.purge()  # journaled messages are recorded as gone
            self._drop(queue)
            auto.pop(queue, None)
        for topic in namespace.topics.values():
            topic.deleted = True
            auto.pop(topic, None)
            for subscription in list(topic.subscriptions.values()):
                self.unsubscribe(subscription)
        namespace.queues = {}
        namespace.topics = {}
        for exchange in namespace.exchanges.values():
            exchange.deleted = True
        namespace.exchanges = predeclared()
        self.populate(namespace)

    # -- topic subscriptions --------------------------------------------------------------------------
    def named_subscription(self, topic: Topic, spec: SubscriptionSpec) -> SubscriptionSpec:
        """``spec``; in a ``servicebus`` namespace, when ``topic`` has the Service Bus subscription it names under
        another case, that one's (subscription names are case-insensitive there, as entity paths are)."""
        if spec.key in topic.subscriptions or not is_servicebus_subscription(topic, spec.key):
            return spec
        wanted = entity_key(spec.key[1])
        found = next((k for k in topic.subscriptions if not k[0] and entity_key(k[1]) == wanted), spec.key)
        return spec._replace(key=found)

    def subscribe(
        self,
        topic: Topic,
        spec: SubscriptionSpec,
        selector: Selector | None,
        no_local: ServerConnection | None,
        *,
        link: bool = True,
    ) -> Subscription:
        """The subscription ``spec`` names, created if needed, with one more link on it (none with ``link=False``:
        a Service Bus ``$management`` request creates the subscription it names, as a receiver's attach would)."""
        existing = topic.subscriptions.get(spec.key)
        if existing is not None and not existing.links and _source(existing.selector) != _source(selector):
            # JMS: a durable subscription resumed with another selector starts afresh
            self.unsubscribe(existing)
        created = spec.key not in topic.subscriptions
        subscription = topic.subscribe(
            spec.key, durable=spec.durable, shared=spec.shared, selector=selector, no_local=no_local, link=link
        )
        if subscription.links == 1:  # resumed (or new): no-local now means this link's connection
            subscription.no_local = no_local
        if created and spec.durable:
            self.recorder.subscription(subscription, subscribed=True)
        return subscription

    def servicebus_subscription(self, topic: Topic, name: str) -> Subscription:
        """The Service Bus subscription ``TOPIC/Subscriptions/NAME`` (keyed as ``attach.py`` keys its receivers'),
        created with no link on it if needed: Service Bus subscriptions exist without receivers."""
        spec = self.named_subscription(topic, SubscriptionSpec.servicebus(name))
        found = topic.subscriptions.get(spec.key)
        return found or self.subscribe(topic, spec, None, None, link=False)

    def durable_subscription(self, conn: ServerConnection, link_name: str) -> Subscription | None:
        """The durable subscription a link name designates (an attach without a source, as JMS unsubscribe
        sends): named by this container, or global; or the shared one the name is a link of (``sub|global``)."""
        remote = conn.remote_open
        container = str(remote.container_id if remote else "")
        shared = shared_subscription_name(link_name)
        for topic in self.namespace_of(conn).topics.values():
            for key in ((container, link_name), ("", link_name), (container, shared), ("", shared)):
                subscription = topic.subscriptions.get(key)
                if subscription is not None and subscription.durable and (key[1] == link_name or subscription.shared):
                    return subscription
        return None

    def unsubscribe(self, subscription: Subscription) -> None:
        """Delete a subscription (its messages go with it)."""
        self._drop(subscription)
        if subscription.durable:
            self.recorder.subscription(subscription, subscribed=False)
        topic = subscription.topic
        if topic.subscriptions.get(subscription.key) is subscription:
            del topic.subscriptions[subscription.key]


def is_servicebus_subscription(topic: Topic, key: tuple[str, str]) -> bool:
    """Whether ``key`` names a Service Bus subscription of ``topic`` (``SubscriptionSpec.servicebus`` in a
    ``servicebus`` namespace): an entity, named without regard to case, that stays when its receivers close."""
    return not key[0] and topic.namespace is not None and bool(topic.namespace.personality.servicebus)


def _random_ids() -> Iterator[str]:
    """The random part of generated addresses: 128 bits from ``secrets``, unguessable."""
    while True:
        yield secrets.token_hex(16)


def _source(selector: Selector | None) -> str | None:
    """The text of a selector (None for none), to compare subscriptions."""
    return selector.source if selector is not None else None
