"""The broker's side of each attached link, and of each message out on one.

A ``Consumer`` takes from a node, a ``Producer`` posts into one, a ``Controller`` is a coordinator link
(Part 4 §4.2). A ``Dispatched`` records one message sent on a consumer link until it is settled: which
transaction acquired it (§4.4.3) and which has staged an outcome for it (§4.4.2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minibroker.amqp.definitions import Released
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link, LinkState, OutgoingDelivery

if TYPE_CHECKING:
    from minibroker.broker.message import Message
    from minibroker.broker.queue import Queue
    from minibroker.broker.selector import Selector
    from minibroker.broker.topic import Topic
    from minibroker.broker.transactions import Transaction


class Consumer:
    """A link on which the broker sends messages from ``queue`` (the peer's receiver)."""

    __slots__ = (
        "browser",
        "conn",
        "cursor",
        "default_outcome",
        "link",
        "owned_node",
        "queue",
        "selector",
        "txn",
        "unsettled",
    )

    def __init__(
        self,
        conn: ServerConnection,
        link: Link,
        queue: Queue,
        default_outcome: Any,
        *,
        selector: Selector | None = None,
        browser: bool = False,
    ) -> None:
        self.conn = conn
        self.link = link
        self.queue = queue
        self.default_outcome = default_outcome
        self.selector = selector  # a queue consumer's JMS selector (a subscription holds its own)
        self.browser = browser  # distribution-mode copy (§3.5.7): sees messages without acquiring them
        self.cursor: tuple[int, int] | None = None  # a browser's position in the queue's delivery order
        self.unsettled: dict[OutgoingDelivery, Dispatched] = {}
        self.txn: Transaction | None = None  # set by a flow carrying txn-id (§4.4.3)
        self.owned_node: Any = None  # a dynamic node created for this link, deleted with it

    @property
    def presettled(self) -> bool:
        """True when the peer asked for settled deliveries (snd-settle-mode settled, §2.8.2)."""
        return self.link.snd_settle_mode == 1

    @property
    def attached(self) -> bool:
        return self.link.state is LinkState.ATTACHED

    def can_take(self) -> bool:
        return self.conn.can_send(self.link)

    def __repr__(self) -> str:
        return f"Consumer({self.link.name!r} on {self.queue.name!r})"


class Producer:
    """A link on which the peer sends messages to ``node`` (None: the anonymous relay routes each by its ``to``)."""

    __slots__ = ("conn", "link", "node", "owned_node")

    def __init__(self, conn: ServerConnection, link: Link, node: Queue | Topic | None) -> None:
        self.conn = conn
        self.link = link
        self.node = node
        self.owned_node: Any = None  # a dynamic node created for this link, deleted with it

    def __repr__(self) -> str:
        return f"Producer({self.link.name!r} to {self.node.name if self.node else None!r})"


class Controller:
    """A coordinator link: the peer declares and discharges transactions on it (§4.2)."""

    __slots__ = ("conn", "link", "rejects_errors")

    def __init__(self, conn: ServerConnection, link: Link, rejects_errors: bool) -> None:
        self.conn = conn
        self.link = link
        self.rejects_errors = rejects_errors
        """True: errors travel as rejected outcomes; False: the link is detached with them (§4.3)."""

    def __repr__(self) -> str:
        return f"Controller({self.link.name!r})"


class Dispatched:
    """A message out on a consumer link, not yet settled."""

    __slots__ = ("acquired_by", "consumer", "delivery", "message", "peer_settled", "retire_outcome", "retired_by")

    def __init__(self, consumer: Consumer, delivery: OutgoingDelivery, message: Message) -> None:
        self.consumer = consumer
        self.delivery = delivery
        self.message = message
        self.acquired_by: Transaction | None = None
        self.retired_by: Transaction | None = None
        self.retire_outcome: Any = None
        self.peer_settled = False

    @property
    def in_transaction(self) -> bool:
        return self.acquired_by is not None or self.retired_by is not None

    def __repr__(self) -> str:
        return f"Dispatched({self.message!r} on {self.consumer!r})"


RELEASED = Released()
