"""Inspection and control of a running broker, shared by the trio runner and the thread runner.

Every read goes through ``_call(fn)``, which runs ``fn`` where the broker's state lives: directly in the
trio runner (same thread), or inside the broker's thread and waiting for the answer in the thread
runner. So one set of classes serves both, and a test never touches broker state from the wrong thread.

    broker.queue("orders").depth            # ready messages
    broker.queue("orders").stats()          # ready, acquired, staged in transactions, consumers
    broker.queue("orders").peek()           # messages as proton presents them, not consumed
    broker.queue("orders").purge()          # drop the ready messages
    broker.topic("news").subscriptions()    # each subscription's name, kind and counts
    broker.topic("news").peek(container, name)  # one subscription's ready messages, not consumed
    broker.transactions                     # open and in-doubt transactions and what each staged
    broker.resolve_transaction(txn_id)      # commit (or roll back) an in-doubt transaction
    broker.connections                      # who is connected
    broker.reset()                          # drop every node, message and transaction
    broker.queue("orders").delete()         # delete the node, detaching its links
    broker.post("orders", payload)          # enqueue an encoded message as a settled transfer would
    broker.close_connection(3)              # close one connection (amqp:connection:forced)
    broker.faults.add("discharge", "lose-outcome")  # fault injection: rules, with list(), remove(id), clear()

``CoreView(broker)`` gives the same handles on a bare core ``Broker`` driven without a runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from minibroker.amqp.definitions import Error
from minibroker.amqp.types import Symbol
from minibroker.broker.core import Broker
from minibroker.broker.faults import FaultInfo, FaultSpec
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.queue import Queue
from minibroker.broker.reads import QueueReads
from minibroker.broker.topic import Subscription, Topic
from minibroker.broker.transactions import TransactionInfo, TransactionStats

if TYPE_CHECKING:
    from minibroker.broker.views import ConnectionInfo, ExchangeInfo, MessageView, QueueStats, SubscriptionStats

T = TypeVar("T")


class PostRefused(ValueError):
    """The broker did not take a message ``post`` gave it: the AMQP condition and description say why."""

    def __init__(self, condition: str, description: str | None) -> None:
        super().__init__(f"{condition}: {description}" if description else condition)
        self.condition = condition
        self.description = description


class CaptureOff(RuntimeError):
    """Captured frames were asked for, and the broker does not capture them (``[broker] capture`` is off)."""


class Inspectable:
    """Something whose broker state is read through ``_call``."""

    def _call(self, fn: Callable[[Broker], T]) -> T:
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError


def _namespace(broker: Broker, name: str) -> Namespace:
    """The namespace called ``name``; ``LookupError`` once it is gone."""
    namespace = broker.namespaces.get(name)
    if namespace is None:
        raise LookupError(f"namespace {name!r} does not exist (any more)")
    return namespace


def _counts(broker: Broker, queue: Queue | None) -> dict[str, int]:
    """The ``NodeCounts`` of ``queue`` (a subscription is one too), zeros when there is none."""
    from minibroker.broker.views import NodeCounts  # the views load on the first read (issue 19: lazy imports)

    return NodeCounts.counts_from_json({}) if queue is None else broker.node_counts(queue)


def _ready(queue: Queue | None, limit: int | None) -> list[tuple[bytes, int]]:
    """(payload, delivery-count) of ``queue``'s first ``limit`` ready messages, read where the broker lives."""
    if queue is None:
        return []
    items = queue.ready if limit is None else queue.ready[:limit]
    return [(m.payload, m.delivery_count) for m in items]


def _views(items: list[tuple[bytes, int]]) -> list[MessageView]:
    """Messages read by ``_ready``, decoded in the caller's thread."""
    from minibroker.broker.views import view_message  # loaded on the first read

    return [view_message(payload, delivery_count=count) for payload, count in items]


class _NodeHandle:
    """A node by name in one namespace; every read goes through the owner, where the broker's state lives."""

    def __init__(self, owner: Inspectable, namespace: str, name: str) -> None:
        self._owner = owner
        self.namespace = namespace
        self.name = name

    def _namespace(self, broker: Broker) -> Namespace:
        return _namespace(broker, self.namespace)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, namespace={self.namespace!r})"


class QueueHandle(_NodeHandle, QueueReads):
    """A queue by name in one namespace; every property reads the current state."""

    def _queue(self, broker: Broker) -> Queue | None:
        return self._namespace(broker).queues.get(self.name)

    def stats(self) -> QueueStats:
        """Ready, acquired, staged and scheduled counts at one instant (zeros when the queue does not exist)."""
        from minibroker.broker.views import QueueStats  # loaded on the first read

        return self._owner._call(lambda broker: QueueStats(name=self.name, **_counts(broker, self._queue(broker))))

    @property
    def exists(self) -> bool:
        """Whether the queue exists now."""
        return self._owner._call(lambda broker: self._queue(broker) is not None)

    def peek(self, limit: int | None = None) -> list[MessageView]:
        """The ready messages in delivery order, decoded, without consuming them."""

        return _views(self._owner._call(lambda broker: _ready(self._queue(broker), limit)))

    def purge(self) -> int:
        """Drop every ready message; return how many were dropped."""

        def purge(broker: Broker) -> int:
            queue = self._queue(broker)
            return broker.purge(queue) if queue is not None else 0

        return self._owner._call(purge)

    @property
    def kind(self) -> str | None:
        """How the queue came to be: "dynamic" (a link's generated node), "auto" (created on demand, deleted once
        idle) or "static" (configured or declared); None when it does not exist."""

        def read(broker: Broker) -> str | None:
            queue = self._queue(broker)
            if queue is None:
                return None
            return "dynamic" if queue.dynamic else "auto" if queue.auto else "static"

        return self._owner._call(read)

    def delete(self) -> bool:
        """Delete the queue with its messages; links attached to it are detached with ``amqp:resource-deleted``
        (their unsettled deliveries are settled as the links go; a transaction that posted to it fails its
        commit). Whether the queue existed."""

        def delete(broker: Broker) -> bool:
            namespace = self._namespace(broker)
            return self.name in namespace.queues and broker.delete_node(namespace, self.name)

        return self._owner._call(delete)


class TopicHandle(_NodeHandle):
    """A topic by name in one namespace; every call reads the current state."""

    def _topic(self, broker: Broker) -> Topic | None:
        return self._namespace(broker).topics.get(self.name)

    @property
    def exists(self) -> bool:
        """Whether the topic exists now."""
        return self._owner._call(lambda broker: self._topic(broker) is not None)

    @property
    def staged(self) -> int:
        """Messages posted to the topic in open transactions, invisible until commit (0 when it does not exist)."""

        def read(broker: Broker) -> int:
            topic = self._topic(broker)
            return 0 if topic is None else topic.staged

        return self._owner._call(read)

    def delete(self) -> bool:
        """Delete the topic with its subscriptions and their messages; links attached to it are detached with
        ``amqp:resource-deleted``. Whether the topic existed."""

        def delete(broker: Broker) -> bool:
            namespace = self._namespace(broker)
            return self.name in namespace.topics and broker.delete_node(namespace, self.name)

        return self._owner._call(delete)

    def subscriptions(self) -> list[SubscriptionStats]:
        """Each subscription's name, kind and counts at one instant, in the order they were made (none when the
        topic does not exist)."""
        from minibroker.broker.views import SubscriptionStats  # loaded on the first read

        def read(broker: Broker) -> list[SubscriptionStats]:
            topic = self._topic(broker)
            if topic is None:
                return []
            return [
                SubscriptionStats(
                    container=s.key[0],
                    name=s.key[1],
                    durable=s.durable,
                    shared=s.shared,
                    held_bytes=s.held_bytes,
                    **_counts(broker, s),
                )
                for s in topic.subscriptions.values()
            ]

        return self._owner._call(read)

    def peek(self, container: str, name: str, limit: int | None = None) -> list[MessageView]:
        """The ready messages of the subscription keyed ``(container, name)`` (as ``subscriptions()`` names it) in
        delivery order, decoded, without consuming them; none when it does not exist."""

        def read(broker: Broker) -> list[tuple[bytes, int]]:
            topic = self._topic(broker)
            subscription: Subscription | None = None if topic is None else topic.subscriptions.get((container, name))
            return _ready(subscription, limit)

        return _views(self._owner._call(read))


class FaultRules:
    """Fault injection rules, as every handle offers them (embedded here, over HTTP in ``remote.py``): see
    ``minibroker.broker.faults`` for the points, actions and how a rule matches. Rules are broker-wide, whichever
    namespace's handle gives them."""

    def add(
        self,
        point: str,
        action: str,
        *,
        times: int = 1,
        after: int = 0,
        condition: str | None = None,
        description: str | None = None,
        delay: float | None = None,
        address: str | None = None,
        container_id: str | None = None,
    ) -> int:
        """Add a rule: at ``point``, do ``action`` on matching events, ``times`` times (0: always) after letting the
        first ``after`` through; its id. ``ValueError`` on an unknown point, action or condition, or a bad value."""
        return self._add(FaultSpec(point, action, times, after, condition, description, delay, address, container_id))

    def _add(self, spec: FaultSpec) -> int:
        raise NotImplementedError

    def list(self) -> list[FaultInfo]:
        """Every rule, in the order added, with ``hits``: how often it fired."""
        raise NotImplementedError

    def remove(self, rule_id: int) -> bool:
        """Remove rule ``rule_id``; whether there was one."""
        raise NotImplementedError

    def clear(self) -> None:
        """Remove every rule."""
        raise NotImplementedError


class FaultsHandle(FaultRules):
    """The fault rules of a broker in this process (read and changed through ``_call``)."""

    def __init__(self, owner: Inspectable) -> None:
        self._owner = owner

    def _add(self, spec: FaultSpec) -> int:
        now = self._owner._now()
        return self._owner._call(lambda broker: broker.add_fault(spec, now))

    def list(self) -> list[FaultInfo]:
        return self._owner._call(lambda broker: broker.faults.list())

    def remove(self, rule_id: int) -> bool:
        return self._owner._call(lambda broker: broker.faults.remove(rule_id))

    def clear(self) -> None:
        self._owner._call(lambda broker: broker.faults.clear())


def amqp091_url(url: str) -> str:
    """The URL an AMQP 0-9-1 client (pika, aio-pika, amqplib) connects with to the listener of ``url``
    (``amqp://HOST:PORT``, the same port: the protocol header tells them apart): ``amqp://guest:guest@HOST:PORT/``,
    the vhost "/" being that listener's namespace (RabbitMQ's default user; any credentials are accepted unless
    users are configured)."""
    scheme, _, address = url.partition("://")
    return f"{scheme}://guest:guest@{address}/"


class NamespaceView(Inspectable):
    """Inspection of one namespace (the default one unless told)."""

    namespace_name: str = DEFAULT_NAMESPACE

    @property
    def url(self) -> str:
        """``amqp://HOST:PORT`` of this namespace's listener."""
        raise NotImplementedError

    @property
    def amqp091_url(self) -> str:
        """``amqp://guest:guest@HOST:PORT/``: this namespace for AMQP 0-9-1 clients (see ``amqp091_url``)."""
        return amqp091_url(self.url)

    def _namespace(self, broker: Broker) -> Namespace:
        return _namespace(broker, self.namespace_name)

    @property
    def faults(self) -> FaultsHandle:
        """Fault injection (broker-wide): ``add(point, action, ...)``, ``list()``, ``remove(id)``, ``clear()``."""
        return FaultsHandle(self)

    @property
    def personality(self) -> str:
        """The name of this namespace's personality: whose behaviour its connections meet."""
        return self._call(lambda broker: self._namespace(broker).personality.name)

    def queue(self, name: str) -> QueueHandle:
        """The queue called ``name`` (it need not exist yet)."""
        return QueueHandle(self, self.namespace_name, name)

    @property
    def queues(self) -> list[str]:
        """Names of the queues that exist now."""
        return self._call(lambda broker: sorted(self._namespace(broker).queues))

    def topic(self, name: str) -> TopicHandle:
        """The topic called ``name`` (it need not exist yet)."""
        return TopicHandle(self, self.namespace_name, name)

    @property
    def topics(self) -> list[str]:
        """Names of the topics that exist now."""
        return self._call(lambda broker: sorted(self._namespace(broker).topics))

    @property
    def exchanges(self) -> list[ExchangeInfo]:
        """The namespace's RabbitMQ exchanges by name (the default one is ""; the predeclared ``amq.*`` ones and
        those AMQP 0-9-1 clients declared), each with its bindings: snapshots (issue 18)."""
        from minibroker.broker.views import ExchangeInfo  # loaded on the first read

        return self._call(
            lambda broker: [ExchangeInfo.of(e) for _, e in sorted(self._namespace(broker).exchanges.items())]
        )

    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions of this namespace's connections and those held in doubt for it, oldest first, with
        what each staged (``state``: "open" or "in-doubt")."""
        now = self._now()

        def read(broker: Broker) -> list[TransactionInfo]:
            namespace = self._namespace(broker)
            return broker.transactions_at(now, namespace.connections, namespace)

        return self._call(read)

    def resolve_transaction(self, txn_id: bytes | str, *, commit: bool = True) -> str:
        """Commit (``commit=False``: roll back) the in-doubt transaction ``txn_id`` (bytes, or hex) of this
        namespace; its state afterwards: "committed", or "rolled-back" (asked for, or a commit that could not be
        applied). ``LookupError`` when no such transaction is in doubt here."""
        if isinstance(txn_id, str):
            try:
                txn_id = bytes.fromhex(txn_id)
            except ValueError:
                raise ValueError(f"txn_id: {txn_id!r} is not hex") from None
        if not isinstance(txn_id, bytes | bytearray | memoryview):
            raise TypeError(f"txn_id: expected bytes or hex text, got {type(txn_id).__name__}")
        key = bytes(txn_id)

        def resolve(broker: Broker) -> str:
            return broker.resolve_transaction(key, commit=commit, namespace=self._namespace(broker))[0]

        return self._call(resolve)

    @property
    def connections(self) -> list[ConnectionInfo]:
        """The connections working in this namespace."""
        return self._call(lambda broker: broker.connection_infos(self._namespace(broker)))

    @property
    def txn_stats(self) -> TransactionStats:
        """Broker-wide transaction counters (declared, committed, rolled back, timed out)."""
        return self._call(lambda broker: broker.txn_stats)

    def condition(
        self, *, queue: str | None = None, depth: int | None = None, transactions: int | None = None
    ) -> Callable[[], bool]:
        """A predicate for ``wait_for`` from the keyword conditions a remote broker checks too (``/api/wait``):
        ``queue``'s depth is ``depth``, the number of open transactions is ``transactions``."""
        if (queue is None) != (depth is None):
            raise TypeError("wait_for: queue and depth go together")
        if queue is None and transactions is None:
            raise TypeError("wait_for: give a predicate, or queue= and depth=, or transactions=")

        def holds() -> bool:
            if queue is not None and self.queue(queue).depth != depth:
                return False
            return transactions is None or len(self.transactions) == transactions

        return holds

    def post(self, address: str, payload: bytes) -> None:
        """Post ``payload`` (an encoded message) to ``address`` as a settled transfer would, creating the node when
        an attach could; ``PostRefused`` (with the AMQP condition and description) when it is refused."""

        refused = self._call(lambda broker: broker.post(self._namespace(broker), address, payload))
        if refused is not None:
            raise PostRefused(str(refused.condition), refused.description)

    def close_connection(
        self, conn_id: int, condition: str = "amqp:connection:forced", description: str | None = None
    ) -> bool:
        """Close connection ``conn_id`` of this namespace with ``condition``; whether it was open here."""
        err = Error(condition=Symbol(condition), description=description)

        def close(broker: Broker) -> bool:
            if not any(c.conn_id == conn_id for c in self._namespace(broker).connections):
                return False
            return broker.close_connection(conn_id, err)

        return self._call(close)

    def reset(self) -> None:
        """Drop every node, message and transaction of this namespace; close its connections."""
        self._call(lambda broker: broker.reset(self._namespace(broker)))


class CoreView(NamespaceView):
    """A bare core ``Broker`` (driven directly, with no runner), read in the caller's thread.

    ``now`` gives the time the core was last driven with (for the ages of open transactions).
    """

    def __init__(
        self, broker: Broker, *, namespace: str = DEFAULT_NAMESPACE, now: Callable[[], float] = lambda: 0.0
    ) -> None:
        self.broker = broker
        self.namespace_name = namespace
        self._clock = now

    def _call(self, fn: Callable[[Broker], T]) -> T:
        return fn(self.broker)

    def _now(self) -> float:
        return self._clock()

    def __repr__(self) -> str:
        return f"CoreView(namespace={self.namespace_name!r})"
