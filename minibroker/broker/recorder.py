"""The journal recorder: what the broker core writes to the journal, and answers that wait for it (DESIGN §4).

With a data directory, every durable message (header.durable) on a queue or durable subscription is
journaled: its arrival (ENQUEUE), its departure (SETTLE: accepted, rejected, expired, dead-lettered,
dropped), failed deliveries (COUNT), and durable subscriptions themselves. A committed transaction is one
TXN record holding all of its durable work, so after a crash it is there entirely or not at all.

The core stays pure: the recorder only *produces* records (``take_journal``), each with an optional action
to run once the record is on disk. The I/O layer writes them, fsyncs (sharing one fsync among all waiting
records), and then runs the actions: that is how ``accepted`` for an unsettled durable transfer, and for a
commit, is sent only after its record is durable. Without a data directory every method here is a no-op
and actions run at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import NamedTuple

from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE
from minibroker.broker.queue import Queue
from minibroker.broker.topic import Subscription
from minibroker.store.journal import Kind, NodeKey, Op

Action = Callable[[], None]


class JournalEntry(NamedTuple):
    """Operations to write as one record (none: just a marker), and what to run once it is durable."""

    ops: list[Op]
    then: Action | None


class Recorder:
    """Journal records of the broker core (``durable`` False: nothing is recorded)."""

    def __init__(self, durable: bool, default_namespace: str) -> None:
        self.durable = durable
        self._default_namespace = default_namespace
        self._out: list[JournalEntry] = []
        self._collecting: list[Op] | None = None
        self._ids = count(1)

    def take_journal(self) -> list[JournalEntry]:
        """Records to write, in order (the I/O layer calls this after every batch of events)."""
        out, self._out = self._out, []
        return out

    def restart_ids(self, after: int) -> None:
        """Number new journaled messages after ``after`` (the largest id recovered)."""
        self._ids = count(after + 1)

    def _record(self, op: Op) -> None:
        if self._collecting is not None:
            self._collecting.append(op)
        else:
            self._out.append(JournalEntry([op], None))

    def after_durable(self, action: Action) -> None:
        """Run ``action`` once everything journaled so far is on disk (at once without a journal)."""
        if not self.durable:
            action()
        else:
            self._out.append(JournalEntry([], action))

    @contextmanager
    def together(self) -> Iterator[None]:
        """Whatever is journaled inside the block goes in one record (a dead-letter's removal and arrival)."""
        if not self.durable or self._collecting is not None:
            yield
            return
        self._collecting = []
        try:
            yield
        finally:
            ops, self._collecting = self._collecting, None
            if ops:
                self._out.append(JournalEntry(ops, None))

    @contextmanager
    def collecting(self) -> Iterator[list[Op]]:
        """Collect what is journaled inside the block (a transaction's work) instead of recording it."""
        ops: list[Op] = []
        outer, self._collecting = self._collecting, ops if self.durable else None
        try:
            yield ops
        finally:
            self._collecting = outer

    def record_then(self, ops: list[Op], then: Action) -> None:
        """Write ``ops`` as one record (a transaction's work), then run ``then`` once it is durable."""
        if ops:
            self._out.append(JournalEntry(ops, then))
        else:
            self.after_durable(then)

    # -- what is journaled --------------------------------------------------------------------------
    def node_key(self, queue: Queue) -> NodeKey | None:
        """The journal's name for ``queue``; None for queues whose messages are not kept (dynamic ones,
        non-durable subscriptions)."""
        namespace = queue.namespace.name if queue.namespace is not None else self._default_namespace
        if isinstance(queue, Subscription):
            if not queue.durable:
                return None
            container, link = queue.key
            return (namespace, "subscription", f"{queue.topic.name}\x00{container}\x00{link}")
        if queue.dynamic:
            return None
        return (namespace, QUEUE, queue.name)

    def adopt(self, queue: Queue) -> None:
        """Let ``queue`` journal its durable messages (when there is a journal and the queue is kept)."""
        if self.durable and self.node_key(queue) is not None:
            queue.journal = self

    def enqueued(self, queue: Queue, message: Message) -> None:
        if queue.journal is None or not message.durable:
            return
        key = self.node_key(queue)
        if key is None:
            return
        message.durable_id = next(self._ids)
        self._record(Op(Kind.ENQUEUE, key, message.durable_id, message.delivery_count, message.payload))

    def removed(self, queue: Queue, message: Message) -> None:
        """A journaled message left ``queue`` for good (called by the queue)."""
        key = self.node_key(queue)
        if key is not None:
            self._record(Op(Kind.SETTLE, key, message.durable_id))
        message.durable_id = 0

    def counted(self, queue: Queue, message: Message) -> None:
        """A journaled message's delivery-count changed."""
        if message.durable_id and queue.journal is not None:
            key = self.node_key(queue)
            if key is not None:
                self._record(Op(Kind.COUNT, key, message.durable_id, message.delivery_count))

    def subscription(self, subscription: Subscription, *, subscribed: bool) -> None:
        """A durable subscription was created (``subscribed``) or deleted."""
        if not self.durable:
            return
        key = self.node_key(subscription)
        if key is None:
            return
        if subscribed:
            subscription.journal = self
            selector = getattr(subscription.selector, "source", "") or ""
            self._record(Op(Kind.SUBSCRIBE, key, selector=selector))
        else:
            self._record(Op(Kind.UNSUBSCRIBE, key))
