"""The broker's side of each attached link: a consumer takes from a node, a producer posts into one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link, OutgoingDelivery

if TYPE_CHECKING:
    from minibroker.broker.queue import Queue


class Consumer:
    """A link on which the broker sends messages from ``queue`` (the peer's receiver)."""

    __slots__ = ("conn", "link", "queue", "unsettled")

    def __init__(self, conn: ServerConnection, link: Link, queue: Queue) -> None:
        self.conn = conn
        self.link = link
        self.queue = queue
        self.unsettled: dict[int, OutgoingDelivery] = {}  # by delivery id

    @property
    def presettled(self) -> bool:
        """True when the peer asked for settled deliveries (snd-settle-mode settled, §2.8.2)."""
        return self.link.snd_settle_mode == 1

    def can_take(self) -> bool:
        return self.conn.can_send(self.link)

    def __repr__(self) -> str:
        return f"Consumer({self.link.name!r} on {self.queue.name!r})"


class Producer:
    """A link on which the peer sends messages to ``queue`` (None: route each by its ``to``)."""

    __slots__ = ("conn", "link", "queue")

    def __init__(self, conn: ServerConnection, link: Link, queue: Queue | None) -> None:
        self.conn = conn
        self.link = link
        self.queue = queue

    def __repr__(self) -> str:
        return f"Producer({self.link.name!r} to {self.queue.name if self.queue else None!r})"
