"""Namespaces (virtual hosts): isolated sets of nodes inside one broker, and how addresses name nodes.

Each connection belongs to one namespace, chosen when its ``open`` arrives: the namespace named by the
open's ``hostname`` if one exists, else the namespace of the listener it came through (the default one,
unless the embedder opened a listener for a namespace of its own). Tests use them to get isolated
state without starting a broker each: resetting a namespace drops its nodes in O(number of nodes).

Node kinds (DESIGN §5): a node's kind comes from the configuration, else from the terminus capabilities
``queue``/``topic`` that Qpid JMS and Artemis send, else from an address prefix (``queue://``,
``topic://``, which is not part of the node's name), else it is a queue.
"""

from __future__ import annotations

from collections.abc import Iterable

from minibroker.broker.exchanges import Exchange, predeclared
from minibroker.broker.personality import MINIBROKER, Personality
from minibroker.broker.queue import Queue
from minibroker.broker.topic import Topic
from minibroker.engine.connection import ServerConnection
from minibroker.servicebus.entities import DEFAULT, EntityProperties, key

DEFAULT_NAMESPACE = "default"
QUEUE, TOPIC = "queue", "topic"
_PREFIXES = {"queue://": QUEUE, "topic://": TOPIC}
_CAPABILITIES = {"queue": QUEUE, "topic": TOPIC, "temporary-queue": QUEUE, "temporary-topic": TOPIC}

Node = Queue | Topic


def parse_address(address: str, capabilities: Iterable[str] | None = None) -> tuple[str, str | None]:
    """The node name an address denotes, and the kind its capabilities or prefix ask for (or None)."""
    kind = None
    for capability in capabilities or ():
        kind = _CAPABILITIES.get(str(capability), kind)
    for prefix, prefix_kind in _PREFIXES.items():
        if address.startswith(prefix):
            return address[len(prefix) :], kind or prefix_kind
    return address, kind


class Namespace:
    """One isolated set of nodes, and the connections working in it."""

    def __init__(self, name: str, personality: Personality = MINIBROKER) -> None:
        self.name = name
        self.personality = personality
        """Whose behaviour its connections meet (``personality.py``)."""
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.exchanges: dict[str, Exchange] = predeclared()
        """RabbitMQ exchanges by name (``exchanges.py``), the predeclared ones first; queues are ``queues``."""
        self.connections: dict[ServerConnection, None] = {}  # (an ordered set: in the order they came)
        self.servicebus_entities: dict[str, EntityProperties] = {}
        """Configured Service Bus entities by ``entities.key`` of their path (``servicebus`` personality only)."""

    def entity_properties(self, path: str) -> EntityProperties:
        """The Service Bus properties of the entity at ``path`` (the defaults when it was not configured)."""
        return self.servicebus_entities.get(key(path), DEFAULT) if self.servicebus_entities else DEFAULT

    def node(self, name: str) -> Node | None:
        """The queue or topic called ``name``; in a ``servicebus`` namespace without regard to case, as Service
        Bus entity paths are (``Orders`` and ``orders`` are one queue; ``entities.key``)."""
        found = self.queues.get(name) or self.topics.get(name)
        if found is None and self.personality.servicebus:
            wanted = key(name)
            nodes: list[Node] = [*self.queues.values(), *self.topics.values()]
            found = next((n for n in nodes if key(n.name) == wanted), None)
        return found

    def remove(self, node: Node) -> None:
        """Forget ``node`` (a deleted dynamic node)."""
        table: dict[str, Queue] | dict[str, Topic] = self.topics if isinstance(node, Topic) else self.queues
        if table.get(node.name) is node:
            del table[node.name]

    @property
    def vhost(self) -> str:
        """Its name as RabbitMQ names a virtual host: the default namespace is "/"."""
        return "/" if self.name == DEFAULT_NAMESPACE else self.name

    def __repr__(self) -> str:
        return f"Namespace({self.name!r}, queues={len(self.queues)}, topics={len(self.topics)})"
