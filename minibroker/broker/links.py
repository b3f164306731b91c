"""The broker's own object for each attached link, and for each message out on one.

A ``Consumer`` takes from a queue (or a topic subscription), a ``Producer`` posts into a node (or, with no
node, through the anonymous relay), a ``Controller`` is a coordinator link (Part 4 §4.2). A ``Dispatched``
records one message out on a consumer link until it is settled. ``ConsumerGroup`` is the round-robin set
of consumers of one queue.

What these objects deliberately do not hold: which transaction acquired a delivery or staged its outcome,
and which transaction a consumer acquires under. The transaction coordinator owns those relations
(``coordinator.py``), so they live in one place and cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibroker.amqp.definitions import Released
from minibroker.amqp.states import Outcome
from minibroker.broker.personality import MINIBROKER, Personality
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link, LinkState, OutgoingDelivery

if TYPE_CHECKING:
    from minibroker.broker.message import Message
    from minibroker.broker.namespace import Node
    from minibroker.broker.queue import Queue, Scan
    from minibroker.broker.selector import Selector
    from minibroker.broker.session_gate import SessionGate
    from minibroker.broker.timers import Lock

_ATTACHED = LinkState.ATTACHED  # globals: ~10x cheaper than enum lookups (issue 19)

RELEASED = Released()


class Consumer:
    """A link on which the broker sends messages from ``queue`` (the peer's receiver)."""

    __slots__ = (
        "__weakref__",  # a message refused with undeliverable-here remembers it weakly
        "browser",
        "conn",
        "cursor",
        "default_outcome",
        "link",
        "owned_node",
        "presettled",
        "queue",
        "scan",
        "selector",
        "servicebus",
        "unsettled",
    )

    def __init__(
        self,
        conn: ServerConnection,
        link: Link,
        queue: Queue,
        default_outcome: Outcome,
        *,
        selector: Selector | SessionGate | None = None,
        browser: bool = False,
    ) -> None:
        self.conn = conn
        self.link = link
        self.queue = queue
        self.default_outcome = default_outcome
        """The source's default outcome (§3.5.3): what a delivery settled without an outcome gets."""
        self.selector = selector
        """A queue consumer's JMS selector (a subscription holds its own); a Service Bus receiver's session gate."""
        self.browser = browser  # distribution-mode copy (§3.5.7): sees messages without acquiring them
        self.cursor: tuple[int, int] | None = None  # a browser's position in the queue's delivery order
        self.scan: Scan | None = None  # how far it has looked for a message it may take (matching dispatch)
        self.unsettled: dict[OutgoingDelivery, Dispatched] = {}
        self.owned_node: Node | None = None  # a dynamic node created for this link, deleted with it
        self.servicebus = False  # a Service Bus receiver: its deliveries carry the annotations Service Bus adds
        # the peer asked for settled deliveries (snd-settle-mode settled, §2.8.2), fixed by the attach: read here
        # once, not through a property per delivery (issue 19)
        self.presettled = link.snd_settle_mode == 1

    @property
    def attached(self) -> bool:
        return self.link.state is _ATTACHED

    def can_take(self) -> bool:
        return self.conn.can_send(self.link)

    def __repr__(self) -> str:
        return f"Consumer({self.link.name!r} on {self.queue.name!r})"


class ConsumerGroup:
    """The consumers of one queue: acquiring ones served round-robin, and browsers."""

    __slots__ = ("_next", "browsers", "consumers", "selective")

    def __init__(self) -> None:
        self.consumers: list[Consumer] = []
        self.browsers: list[Consumer] = []
        self.selective = 0  # consumers with a selector: dispatch must match messages to consumers
        self._next = 0

    def __bool__(self) -> bool:
        return bool(self.consumers or self.browsers)

    def add(self, consumer: Consumer) -> None:
        if consumer.browser:
            self.browsers.append(consumer)
            return
        self.consumers.append(consumer)
        if consumer.selector is not None:
            self.selective += 1

    def remove(self, consumer: Consumer) -> None:
        if consumer in self.browsers:
            self.browsers.remove(consumer)
        elif consumer in self.consumers:
            index = self.consumers.index(consumer)
            del self.consumers[index]
            if index < self._next:
                self._next -= 1  # (the one whose turn it is moves up a place: it keeps its turn)
            if consumer.selector is not None:
                self.selective -= 1
        if consumer.scan is not None:
            consumer.queue.close_scan(consumer.scan)
            consumer.scan = None

    def next_consumer(self) -> Consumer | None:
        """The next acquiring consumer, round-robin, that can take a message now."""
        consumers = self.consumers
        n = len(consumers)
        for i in range(n):
            index = (self._next + i) % n
            consumer = consumers[index]
            if consumer.conn.can_send(consumer.link):  # (``can_take`` without its call: per delivery, issue 19)
                self._next = (index + 1) % n
                return consumer
        return None

    def in_turn(self) -> list[Consumer]:
        """The acquiring consumers in round-robin order, starting with the one whose turn it is."""
        consumers = self.consumers
        start = self._next % len(consumers) if consumers else 0
        return consumers[start:] + consumers[:start]

    def rotate_past(self, consumer: Consumer) -> None:
        """Make round-robin continue after ``consumer``."""
        if consumer in self.consumers:
            self._next = (self.consumers.index(consumer) + 1) % len(self.consumers)


class Producer:
    """A link on which the peer sends messages to ``node`` (None: the anonymous relay routes each by ``to``)."""

    __slots__ = ("conn", "entity", "exchange", "link", "node", "owned_node", "route", "servicebus")

    def __init__(
        self,
        conn: ServerConnection,
        link: Link,
        node: Node | None,
        exchange: str | None = None,
        route: str | None = None,
    ) -> None:
        self.conn = conn
        self.link = link
        self.node = node
        self.owned_node: Node | None = None  # a dynamic node created for this link, deleted with it
        self.exchange = exchange
        """With no node: the exchange every message goes to (a RabbitMQ 4 ``/exchanges/NAME[/KEY]`` target)."""
        self.route = route
        """The routing key of every message sent to ``exchange`` (None: each message's own, ``routing_key``)."""
        self.servicebus = False
        """A Service Bus sender: messages are stamped on arrival, batches split (``minibroker.servicebus``)."""
        self.entity: str | None = None
        """A Service Bus sender's top-level entity, the one its transactional work is on: its node's, or the via
        entity's of a via-sender (``minibroker.servicebus.via``); None: the entity each routed message reaches."""

    def __repr__(self) -> str:
        return f"Producer({self.link.name!r} to {self.node.name if self.node else None!r})"


class Controller:
    """A coordinator link: the peer declares and discharges transactions on it (§4.2)."""

    __slots__ = ("check_back", "conn", "link", "personality", "rejects_errors")

    def __init__(
        self,
        conn: ServerConnection,
        link: Link,
        rejects_errors: bool,
        personality: Personality = MINIBROKER,
        *,
        check_back: bool = False,
    ) -> None:
        self.conn = conn
        self.link = link
        self.rejects_errors = rejects_errors
        """True: errors travel as rejected outcomes; False: the link is detached with them (§4.3)."""
        self.personality = personality
        """The personality of its connection's namespace: how its transactions behave."""
        self.check_back = check_back
        """Its transactions are held in doubt when the connection is lost (``checkback.py``)."""

    def __repr__(self) -> str:
        return f"Controller({self.link.name!r})"


class Dispatched:
    """A message out on a consumer link, not yet settled; found again through ``consumer.unsettled``."""

    __slots__ = ("consumer", "delivery", "lock", "message")

    def __init__(self, consumer: Consumer, delivery: OutgoingDelivery, message: Message) -> None:
        self.consumer = consumer
        self.delivery = delivery
        self.message = message
        self.lock: Lock | None = None
        """Its Service Bus peek-lock (a ``timers.Lock``), when it is a locked Service Bus delivery."""

    def __repr__(self) -> str:
        return f"Dispatched({self.message!r} on {self.consumer!r})"
