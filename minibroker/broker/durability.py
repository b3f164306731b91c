"""The broker's side of durability: what goes in the journal, and answers that wait for it (DESIGN §4).

With a data directory, every durable message (header.durable) on a queue or durable subscription is
journaled: its arrival (ENQUEUE), its departure (SETTLE: accepted, rejected, expired, dead-lettered,
dropped), failed deliveries (COUNT), and durable subscriptions themselves. A committed transaction is one
TXN record holding all of its durable work, so after a crash it is there entirely or not at all.

The core stays pure: it only *produces* records (``take_journal``), each with an optional action to run
once the record is on disk. The I/O layer writes them, fsyncs (sharing one fsync among all waiting
records), and then runs the actions: that is how ``accepted`` for an unsettled durable transfer, and for a
commit, is sent only after its record is durable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count
from typing import Any, NamedTuple

from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE, TOPIC
from minibroker.broker.queue import Queue
from minibroker.broker.state import BrokerState
from minibroker.broker.topic import Subscription, Topic
from minibroker.store.journal import DurableState, Kind, NodeKey, Op

Action = Callable[[], None]


class JournalEntry(NamedTuple):
    """Operations to write as one record (none: just a marker), and what to run once it is durable."""

    ops: list[Op]
    then: Action | None


class DurabilityMixin(BrokerState):
    """Journal records and durable acknowledgements."""

    durable: bool = False
    journal_sink: Any = None
    """Set by the I/O layer: the object that writes ``take_journal()``'s records (see server/journal.py)."""
    _journal_out: list[JournalEntry]
    _collecting: list[Op] | None
    _durable_ids: Any

    def _init_durability(self, durable: bool) -> None:
        self.durable = durable
        self._journal_out = []
        self._collecting = None
        self._durable_ids = count(1)

    def take_journal(self) -> list[JournalEntry]:
        """Records to write, in order (the I/O layer calls this after every batch of events)."""
        out, self._journal_out = self._journal_out, []
        return out

    def _record(self, op: Op) -> None:
        if self._collecting is not None:
            self._collecting.append(op)
        else:
            self._journal_out.append(JournalEntry([op], None))

    def _after_durable(self, action: Action) -> None:
        """Run ``action`` once everything journaled so far is on disk (at once without a journal)."""
        if not self.durable:
            action()
        else:
            self._journal_out.append(JournalEntry([], action))

    @contextmanager
    def _journal_together(self) -> Iterator[None]:
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
                self._journal_out.append(JournalEntry(ops, None))

    def _journal_ops(self, ops: list[Op], then: Action) -> None:
        """Write ``ops`` as one record (a transaction's work), then run ``then`` once it is durable."""
        if ops:
            self._journal_out.append(JournalEntry(ops, then))
        else:
            self._after_durable(then)

    # -- node keys ----------------------------------------------------------------------------------
    def _node_key(self, queue: Queue) -> NodeKey | None:
        namespace = queue.namespace.name if queue.namespace is not None else self.default.name
        if isinstance(queue, Subscription):
            if not queue.durable:
                return None
            container, link = queue.key
            return (namespace, "subscription", f"{queue.topic.name}\x00{container}\x00{link}")
        if queue.dynamic:
            return None
        return (namespace, QUEUE, queue.name)

    def _make_durable(self, queue: Queue) -> None:
        """Let ``queue`` journal its durable messages (when the broker has a journal and it is durable)."""
        if self.durable and self._node_key(queue) is not None:
            queue.journal = self

    # -- hooks ------------------------------------------------------------------------------------------
    def _journal_enqueue(self, queue: Queue, message: Message) -> None:
        if queue.journal is None or not message.durable:
            return
        key = self._node_key(queue)
        if key is None:
            return
        message.durable_id = next(self._durable_ids)
        self._record(Op(Kind.ENQUEUE, key, message.durable_id, message.delivery_count, message.payload))

    def removed(self, queue: Queue, message: Message) -> None:
        """Called by a queue when a journaled message leaves it for good."""
        key = self._node_key(queue)
        if key is not None:
            self._record(Op(Kind.SETTLE, key, message.durable_id))
        message.durable_id = 0

    def _journal_count(self, queue: Queue, message: Message) -> None:
        if message.durable_id and queue.journal is not None:
            key = self._node_key(queue)
            if key is not None:
                self._record(Op(Kind.COUNT, key, message.durable_id, message.delivery_count))

    def _journal_subscription(self, subscription: Subscription, subscribed: bool) -> None:
        if not self.durable:
            return
        key = self._node_key(subscription)
        if key is None:
            return
        if subscribed:
            subscription.journal = self
            selector = getattr(subscription.selector, "source", "") or ""
            self._record(Op(Kind.SUBSCRIBE, key, selector=selector))
        else:
            self._record(Op(Kind.UNSUBSCRIBE, key))

    # -- recovery ---------------------------------------------------------------------------------------
    def restore(self, state: DurableState) -> int:
        """Recreate durable nodes, subscriptions and messages (in their order) from a recovered journal.

        Returns the number of messages restored.
        """
        from minibroker.broker.selector import Selector, SelectorError

        self._durable_ids = count(state.max_message_id + 1)
        restored = 0
        for key, selector in state.subscriptions.items():
            namespace_name, _, name = key
            topic_name, container, link = name.split("\x00")
            namespace = self.namespace(namespace_name)
            topic = namespace.topics.get(topic_name)
            if topic is None:
                node = self._create_node(namespace, topic_name, TOPIC)
                assert isinstance(node, Topic)
                topic = node
            try:
                parsed = Selector(selector) if selector else None
            except SelectorError:
                parsed = None
            subscription = topic.subscribe((container, link), durable=True, shared=False, selector=parsed)
            subscription.links = 0
            subscription.journal = self
        for key, messages in state.messages.items():
            queue = self._restored_queue(key)
            if queue is None:
                continue
            for stored in sorted(messages.values(), key=lambda m: m.message_id):
                message = Message(stored.payload)
                message.delivery_count = stored.delivery_count
                message.durable_id = stored.message_id
                self._seq += 1
                message.seq = self._seq
                queue.put(message)
                restored += 1
        return restored

    def _restored_queue(self, key: NodeKey) -> Queue | None:
        namespace_name, kind, name = key
        namespace = self.namespace(namespace_name)
        if kind == QUEUE:
            queue = namespace.queues.get(name)
            if queue is None:
                node = self._create_node(namespace, name, QUEUE)
                if not isinstance(node, Queue):
                    return None
                queue = node
            return queue
        topic_name, container, link = name.split("\x00")
        topic = namespace.topics.get(topic_name)
        return topic.subscriptions.get((container, link)) if topic is not None else None
