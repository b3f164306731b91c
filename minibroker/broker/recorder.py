"""The journal recorder: what the broker core writes to the journal, and answers that wait for it (DESIGN §4).

With a data directory, every durable message (header.durable) on a queue or durable subscription is
journaled: its arrival (ENQUEUE, with its expiry and delivery time as wall-clock instants), its departure
(SETTLE: accepted, rejected, expired, dead-lettered, dropped), failed deliveries (COUNT), and durable
subscriptions themselves. A committed transaction is one TXN record holding all of its durable work, so
after a crash it is there entirely or not at all; so is a publish to several durable nodes (the journal
writes its payload once).

Records go to a *sink*, the I/O layer's journal writer (``server/journal.py``), the moment they are made, in
order: the write itself is synchronous (into the operating system's cache), so a publish learns before its
message is visible whether the journal took it; the fsync is not, and an action (``accepted`` for an
unsettled durable transfer, or for a commit) runs once the fsync covering its record is done. While the
journal cannot write (disk full), ``accepting`` is False: new durable work is refused with
``amqp:resource-limit-exceeded`` (``refusal``), and records that must still be kept (a consumer's settlement,
a dead-letter) wait in the writer's backlog, in order, until the disk takes them. Without a sink (a broker core
driven by tests) records pile up for ``take_journal``. Without a data directory every method here is a
no-op and actions run at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from typing import NamedTuple, Protocol

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.broker.clock import BrokerClock
from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE
from minibroker.broker.queue import Queue
from minibroker.broker.topic import Subscription
from minibroker.store import records
from minibroker.store.records import Kind, NodeKey, Op

Action = Callable[[], None]
SUBSCRIPTION = "subscription"
RECORD_MARGIN = 64 << 10
"""What a record holds besides its messages' bytes, at most (node names, ids, a dead-letter's annotations)."""


class JournalEntry(NamedTuple):
    """Operations to write as one record (none: just a marker), and what to run once it is durable."""

    ops: list[Op]
    then: Action | None


class JournalSink(Protocol):
    """Where records go as they are made (the I/O layer's journal writer)."""

    @property
    def accepting(self) -> bool:
        """False while the journal cannot write (disk full): durable work is refused."""

    def append(self, ops: list[Op], then: Action | None) -> None:
        """Write ``ops`` (one record; none: a marker), then run ``then`` once it is durable. If the journal
        cannot write now, both wait, in order, until it can."""

    def try_append(self, ops: list[Op]) -> bool:
        """Write ``ops`` now; False (nothing written, nothing kept) if the journal does not take them."""


@dataclass
class Written:
    """The outcome of a ``refusable`` block: ``ok`` False when the journal refused its record; ``enqueued``: the
    messages the block journaled, which the caller then takes back."""

    ok: bool = True
    enqueued: list[tuple[Queue, Message]] = field(default_factory=list)


def journal_full_error() -> Error:
    return error(
        Condition.RESOURCE_LIMIT_EXCEEDED,
        "the journal cannot write (disk full or failing): durable messages are refused until it can",
    )


class Recorder:
    """Journal records of the broker core (``durable`` False: nothing is recorded)."""

    def __init__(self, durable: bool, default_namespace: str, clock: BrokerClock | None = None) -> None:
        self.durable = durable
        self._default_namespace = default_namespace
        self._clock = clock or BrokerClock()
        self._out: list[JournalEntry] = []
        self._collecting: list[Op] | None = None
        self._watch: list[tuple[Queue, Message]] | None = None
        self._ids = count(1)
        self.sink: JournalSink | None = None
        """Set by the I/O layer: records are written to it as they are made (else kept for ``take_journal``)."""

    def take_journal(self) -> list[JournalEntry]:
        """Records made while no sink was connected, in order (recovery's, or all of them in core tests)."""
        out, self._out = self._out, []
        return out

    def restart_ids(self, after: int) -> None:
        """Number new journaled messages after ``after`` (the largest id recovered)."""
        self._ids = count(after + 1)

    def _emit(self, ops: list[Op], then: Action | None) -> None:
        if self.sink is None:
            self._out.append(JournalEntry(ops, then))
        else:
            self.sink.append(ops, then)

    def _record(self, op: Op) -> None:
        if self._collecting is not None:
            self._collecting.append(op)
        else:
            self._emit([op], None)

    def after_durable(self, action: Action) -> None:
        """Run ``action`` once everything journaled so far is on disk (at once without a journal)."""
        if not self.durable:
            action()
        else:
            self._emit([], action)

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
                self._emit(ops, None)

    @contextmanager
    def refusable(self) -> Iterator[Written]:
        """Like ``together`` (a publish: its message on every node, one record), except that the journal may
        refuse the record (disk full): then ``ok`` is False, nothing of the messages enqueued inside is kept
        (the caller takes them back from their queues: ``enqueued``), and the block's other records (messages a
        drop-head policy removed) still go to the journal, in order."""
        written = Written()
        if not self.durable:
            yield written
            return
        outer_watch, self._watch = self._watch, written.enqueued
        nested = self._collecting is not None
        if not nested:
            self._collecting = []
        try:
            yield written
        except BaseException:
            if not nested:
                ops, self._collecting = self._collecting, None
                if ops:
                    self._emit(ops, None)
            raise
        finally:
            self._watch = outer_watch
        if nested:
            return
        ops, self._collecting = self._collecting or [], None
        if not ops:
            return
        if self.sink is None:
            self._out.append(JournalEntry(ops, None))
        elif not self.sink.try_append(ops):
            written.ok = False
            taken = {message.durable_id for _, message in written.enqueued}  # ids are unique: one ENQUEUE each
            rest = [op for op in ops if not (op.kind is Kind.ENQUEUE and op.message_id in taken)]
            for _, message in written.enqueued:
                message.durable_id = 0
            if rest:
                self.sink.append(rest, None)

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
            self._emit(ops, then)
        elif not self.accepting:
            then()  # nothing of it is journaled: it waits for nothing while the journal cannot write
        else:
            self.after_durable(then)

    # -- refusing durable work while the journal cannot write -----------------------------------------------
    @property
    def accepting(self) -> bool:
        """False while the journal cannot write (disk full): new durable work is refused."""
        return not self.durable or self.sink is None or self.sink.accepting

    def journals(self, queue: Queue, message: Message) -> bool:
        """True when ``message`` on ``queue`` goes to the journal."""
        return self.durable and message.durable and queue.journaled and self.node_key(queue) is not None

    def may_refuse(self, message: Message) -> bool:
        """False when ``message`` is surely taken by the journal (or not journaled): the usual, cheap case."""
        return self.durable and message.durable and (not self.accepting or self.too_large(message.size) is not None)

    def refusal(self, targets: list[Queue], message: Message) -> Error | None:
        """``amqp:resource-limit-exceeded`` when ``message`` would be journaled on one of ``targets`` while the
        journal cannot write, or is too large for a journal record; else None (non-durable messages and nodes
        are served as ever)."""
        if not self.durable or not self.may_refuse(message):  # (``durable`` first: no call without a journal, issue 19)
            return None
        if any(self.journals(queue, message) for queue in targets):
            return journal_full_error() if not self.accepting else self.too_large(message.size)
        return None

    def too_large(self, size: int) -> Error | None:
        """``amqp:resource-limit-exceeded`` when a record holding ``size`` bytes of messages would be larger
        than the journal reads back (``MAX_RECORD``); checked before anything is applied."""
        if not self.durable or size + RECORD_MARGIN <= records.MAX_RECORD:
            return None
        return error(
            Condition.RESOURCE_LIMIT_EXCEEDED,
            f"{size} bytes of durable messages in one step are more than a journal record holds "
            f"({records.MAX_RECORD - RECORD_MARGIN} bytes)",
        )

    # -- what is journaled --------------------------------------------------------------------------
    def node_key(self, queue: Queue) -> NodeKey | None:
        """The journal's name for ``queue``; None for queues whose messages are not kept (dynamic ones,
        non-durable subscriptions)."""
        namespace = queue.namespace.name if queue.namespace is not None else self._default_namespace
        if isinstance(queue, Subscription):
            if not queue.durable:
                return None
            container, link = queue.key
            return (namespace, SUBSCRIPTION, queue.topic.name, str(container), str(link))
        if queue.dynamic:
            return None
        return (namespace, QUEUE, queue.name)

    def adopt(self, queue: Queue) -> None:
        """Let ``queue`` journal its durable messages (when there is a journal and the queue is kept)."""
        if self.durable and self.node_key(queue) is not None:
            self.watch(queue)

    def watch(self, queue: Queue) -> None:
        """Have ``queue`` report here each journaled message that leaves it for good (``removed``)."""
        queue.on_departure = partial(self.removed, queue)

    def _wall_ms(self, instant: float | None) -> int | None:
        """A broker-clock instant as wall-clock milliseconds (what the journal keeps: the clock restarts)."""
        if instant is None or not math.isfinite(instant):
            return None  # (``arrive`` ignores such times: never reached, and never an error here)
        return round((instant + self._clock.wall.offset) * 1000)

    def enqueued(self, queue: Queue, message: Message) -> None:
        if not queue.journaled or not message.durable:
            return
        key = self.node_key(queue)
        if key is None:
            return
        message.durable_id = next(self._ids)
        if self._watch is not None:
            self._watch.append((queue, message))
        self._record(
            Op(
                Kind.ENQUEUE,
                key,
                message.durable_id,
                message.delivery_count,
                message.payload,
                expires_at=self._wall_ms(message.expires_at),
                deliver_at=self._wall_ms(message.deliver_at),
            )
        )

    def removed(self, queue: Queue, message: Message) -> None:
        """A journaled message left ``queue`` for good (reported by the queue: ``watch``)."""
        key = self.node_key(queue)
        if key is not None:
            self._record(Op(Kind.SETTLE, key, message.durable_id))
        message.durable_id = 0

    def counted(self, queue: Queue, message: Message) -> None:
        """A journaled message's delivery-count changed."""
        if message.durable_id and queue.journaled:
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
            self.watch(subscription)
            selector = getattr(subscription.selector, "source", "") or ""
            self._record(Op(Kind.SUBSCRIBE, key, selector=selector, shared=subscription.shared))
        else:
            self._record(Op(Kind.UNSUBSCRIBE, key))
