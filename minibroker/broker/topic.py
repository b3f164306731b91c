"""A topic: every subscription gets its own copy of each message (multicast).

Subscriptions are the queues of a topic. A receiver link makes a non-durable subscription of its own,
deleted when the link goes. A *durable* subscription (source durable and expiry-policy never, as JMS
durable subscribers attach) is named by the container-id and the link name; it keeps collecting while no
link is attached, is resumed by the next attach with the same name, and is deleted by a detach with
closed=true. A *shared* subscription (source capability ``shared``) is one queue whose links compete for
its messages; with capability ``global`` its name does not include the container-id. Its links are named as
Qpid JMS names them: the subscription's name, then ``|`` and anything (``sub``, ``sub|2``, ``sub|global2``,
``sub|volatile1``); a durable and a non-durable shared subscription of one name are two subscriptions (JMS 2.0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minibroker.broker.message import Message
from minibroker.broker.policy import NodePolicy
from minibroker.broker.queue import Queue

if TYPE_CHECKING:
    from minibroker.broker.selector import Selector


def shared_subscription_name(link_name: str) -> str:
    """The name of the shared subscription a link called ``link_name`` takes: what comes before the first ``|``."""
    return link_name.partition("|")[0]


class Subscription(Queue):
    """One subscription of a topic: a queue fed with a copy of every matching message."""

    kind = "subscription"

    def __init__(
        self,
        topic: Topic,
        key: tuple[str, str],
        *,
        durable: bool,
        shared: bool,
        selector: Selector | None,
        no_local: Any = None,
    ) -> None:
        super().__init__(f"{topic.name}::{key[0]}:{key[1]}", topic.policy, node_name=topic.name)
        self.topic = topic
        self.namespace = topic.namespace
        self.key = key
        self.durable = durable
        self.shared = shared
        self.selector = selector
        self.no_local = no_local  # the connection whose own messages this subscription does not want
        self.links = 0
        self.rules: dict[str, Any] | None = None
        """A Service Bus subscription's rules by name (``Dispatcher.subscription_rules``), made on first use."""


class Topic:
    """One topic node."""

    kind = "topic"

    def __init__(self, name: str, policy: NodePolicy | None = None) -> None:
        self.name = name
        self.policy = policy or NodePolicy()
        self.subscriptions: dict[tuple[str, str], Subscription] = {}
        self.dynamic = False
        self.owner: object = None  # the connection that created a dynamic topic: only it may subscribe
        self.deleted = False  # a deleted (dynamic) topic: transactions that posted to it cannot commit
        self.auto = False  # created on demand: deleted once idle for ``auto_delete_idle``
        self.idle_since: float | None = None
        self.idle_mark = 0
        self.published_total = 0  # posts that reached it (the idle sweep's sign of use)
        self.namespace: Any = None
        self.staged = 0  # messages posted in open transactions, invisible until commit

    def subscribe(
        self,
        key: tuple[str, str],
        *,
        durable: bool,
        shared: bool,
        selector: Selector | None,
        no_local: Any = None,
        link: bool = True,
    ) -> Subscription:
        """The subscription called ``key``, created if needed; counts one more link on it (unless not ``link``)."""
        subscription = self.subscriptions.get(key)
        if subscription is None:
            subscription = Subscription(self, key, durable=durable, shared=shared, selector=selector, no_local=no_local)
            self.subscriptions[key] = subscription
        if link:
            subscription.links += 1
        return subscription

    def publish(
        self, message: Message, origin: Any, matches: Callable[[Subscription, Message], bool]
    ) -> list[Subscription]:
        """The subscriptions that take a copy of ``message`` (published by connection ``origin``; counted in
        ``published_total`` by whoever publishes it, once, not here: a transaction asks more than once)."""
        return [
            s
            for s in self.subscriptions.values()
            if (s.no_local is None or s.no_local is not origin) and matches(s, message)
        ]

    @property
    def depth(self) -> int:
        """Messages ready across all subscriptions."""
        return sum(s.depth for s in self.subscriptions.values())

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, subscriptions={len(self.subscriptions)})"
