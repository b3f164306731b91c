"""Inspection and control of a running broker, shared by the trio runner and the thread runner.

Every read goes through ``_call(fn)``, which runs ``fn`` where the broker's state lives: directly in the
trio runner (same thread), or inside the broker's thread and waiting for the answer in the thread
runner. So one set of classes serves both, and a test never touches broker state from the wrong thread.

    broker.queue("orders").depth            # ready messages
    broker.queue("orders").stats()          # ready, acquired, staged in transactions, consumers
    broker.queue("orders").peek()           # messages as proton presents them, not consumed
    broker.queue("orders").purge()          # drop the ready messages
    broker.transactions                     # open transactions and what each staged
    broker.connections                      # who is connected
    broker.reset()                          # drop every node, message and transaction
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from minibroker.broker.core import Broker
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.queue import Queue
from minibroker.broker.transactions import TransactionInfo, TransactionStats
from minibroker.broker.views import ConnectionInfo, MessageView, QueueStats, view_message

T = TypeVar("T")


class Inspectable:
    """Something whose broker state is read through ``_call``."""

    def _call(self, fn: Callable[[Broker], T]) -> T:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError


class QueueHandle:
    """A queue by name in one namespace; every property reads the current state."""

    def __init__(self, owner: Inspectable, namespace: str, name: str) -> None:
        self._owner = owner
        self.namespace = namespace
        self.name = name

    def _queue(self, broker: Broker) -> Queue | None:
        namespace = broker.namespaces.get(self.namespace)
        if namespace is None:
            raise LookupError(f"namespace {self.namespace!r} does not exist (any more)")
        return namespace.queues.get(self.name)

    def stats(self) -> QueueStats:
        """Ready, acquired and staged counts at one instant (zeros when the queue does not exist)."""

        def read(broker: Broker) -> QueueStats:
            queue = self._queue(broker)
            if queue is None:
                return QueueStats(self.name, 0, 0, 0, 0, 0)
            return QueueStats(
                self.name,
                queue.depth,
                queue.acquired,
                queue.staged,
                broker.dispatcher.consumer_count(queue),
                queue.enqueued_total,
            )

        return self._owner._call(read)

    @property
    def exists(self) -> bool:
        return self._owner._call(lambda broker: self._queue(broker) is not None)

    @property
    def depth(self) -> int:
        """Messages ready for delivery (not counting acquired ones or ones staged in transactions)."""
        return self.stats().ready

    @property
    def ready(self) -> int:
        return self.stats().ready

    @property
    def acquired(self) -> int:
        """Messages delivered to a consumer and not yet settled."""
        return self.stats().acquired

    @property
    def staged(self) -> int:
        """Messages posted in open transactions, invisible until commit."""
        return self.stats().staged

    def peek(self, limit: int | None = None) -> list[MessageView]:
        """The ready messages in delivery order, decoded, without consuming them."""

        def read(broker: Broker) -> list[tuple[bytes, int]]:
            queue = self._queue(broker)
            if queue is None:
                return []
            items = queue.ready if limit is None else queue.ready[:limit]
            return [(m.payload, m.delivery_count) for m in items]

        return [view_message(p, delivery_count=c) for p, c in self._owner._call(read)]

    def purge(self) -> int:
        """Drop every ready message; return how many were dropped."""

        def purge(broker: Broker) -> int:
            queue = self._queue(broker)
            return queue.purge() if queue is not None else 0

        return self._owner._call(purge)

    def __repr__(self) -> str:
        return f"QueueHandle({self.name!r}, namespace={self.namespace!r})"


class NamespaceView(Inspectable):
    """Inspection of one namespace (the default one unless told)."""

    namespace_name: str = DEFAULT_NAMESPACE

    def _namespace(self, broker: Broker) -> Namespace:
        namespace = broker.namespaces.get(self.namespace_name)
        if namespace is None:
            raise LookupError(f"namespace {self.namespace_name!r} does not exist (any more)")
        return namespace

    def queue(self, name: str) -> QueueHandle:
        """The queue called ``name`` (it need not exist yet)."""
        return QueueHandle(self, self.namespace_name, name)

    @property
    def queues(self) -> list[str]:
        """Names of the queues that exist now."""
        return self._call(lambda broker: sorted(self._namespace(broker).queues))

    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions of this namespace's connections, oldest first, with what each staged."""
        now = self._now()

        def read(broker: Broker) -> list[TransactionInfo]:
            conns = self._namespace(broker).connections
            return [t for t in broker.transactions_at(now, conns)]

        return self._call(read)

    @property
    def connections(self) -> list[ConnectionInfo]:
        """The connections working in this namespace."""
        return self._call(lambda broker: broker.connection_infos(self._namespace(broker)))

    @property
    def txn_stats(self) -> TransactionStats:
        """Broker-wide transaction counters (declared, committed, rolled back, timed out)."""
        return self._call(lambda broker: broker.txn_stats)

    def reset(self) -> None:
        """Drop every node, message and transaction of this namespace; close its connections."""
        self._call(lambda broker: broker.reset(self._namespace(broker)))
