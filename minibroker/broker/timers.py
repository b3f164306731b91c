"""Message timers: expiry and scheduled visibility, on the broker's clock (see ``clock.py``).

One heap for the whole broker, of three kinds of entry:

- ``Expiry``: a message's ttl or absolute-expiry-time. One entry per post, whatever the number of queues
  that took a copy (a topic's subscriptions): it names those queues and the copies' shared place in
  delivery order (``Content.key``), never the messages themselves, so a timer keeps no message alive. When
  it comes due, each queue's ready copy at that place is expired. Copies that are acquired or scheduled
  then are checked when they come back (a release, a redelivery delay's end).
- ``Due``: messages that become visible later (a delivery time, a redelivery delay). They are on no ready
  list meanwhile, so the entry holds them (and their queues).
- ``Lock``: a Service Bus peek-lock on a delivery (``servicebus`` personality only): when it runs out the
  message goes back. Settling or renewing the delivery cancels it.

A copy that leaves its queue for good (consumed, expired, dropped) tells its ``Expiry`` (``left``); an entry
no copy needs any more is dead, and the heap is rebuilt without its dead entries once they outnumber the
live ones, so consumed messages cost nothing after they are gone and the heap stays within twice what is
live. A deleted queue's scheduled messages are counted dead the same way (``queue_gone``).
"""

from __future__ import annotations

import heapq
from enum import Enum
from itertools import count
from typing import Any

from minibroker.broker.message import Message
from minibroker.broker.queue import Queue

_COMPACT_MIN = 256  # dead entries below this never trigger a rebuild


class TimerKind(Enum):
    EXPIRE = "expire"  # the message's ttl or absolute-expiry-time has passed
    DUE = "due"  # a scheduled (or redelivery-delayed) message becomes visible


class Expiry:
    """When the copies of one post expire: the queues that took one, and their shared place in them."""

    __slots__ = ("key", "live", "owner", "queues", "when")

    def __init__(self, owner: Timers, when: float, queues: tuple[Queue, ...], key: tuple[int, int]) -> None:
        self.owner = owner
        self.when = when
        self.queues: tuple[Queue, ...] | None = queues
        self.key = key
        self.live = len(queues)

    def left(self) -> None:
        """A copy left its queue for good."""
        self.live -= 1
        if self.live <= 0 and self.queues is not None:
            self.queues = None  # dead: holds nothing until the heap is rebuilt without it
            self.owner.dead += 1
            self.owner.maybe_compact()

    @property
    def alive(self) -> bool:
        return self.queues is not None

    def __repr__(self) -> str:
        return f"Expiry(at={self.when}, live={self.live})"


class Due:
    """Messages (each on its queue) that become visible at ``when``."""

    __slots__ = ("items", "when")

    def __init__(self, when: float, items: list[tuple[Queue, Message]]) -> None:
        self.when = when
        self.items = items

    @property
    def alive(self) -> bool:
        return any(not queue.deleted for queue, _ in self.items)  # (False once empty)

    def __repr__(self) -> str:
        return f"Due(at={self.when}, messages={len(self.items)})"


class Lock:
    """A Service Bus peek-lock (issue 17 item 5): at ``when`` the delivery ``holder`` (a ``Dispatched``) still
    unsettled loses its lock. ``cancel`` when it is settled or renewed (the entry is then dead). Sessions (item 8)
    use it too: for a session's lock (``sessions.SessionLock``) and a receiver's wait for one (``Waiter``)."""

    __slots__ = ("holder", "owner", "when")

    def __init__(self, owner: Timers, when: float, holder: Any) -> None:
        self.owner = owner
        self.when = when
        self.holder: Any = holder

    def cancel(self) -> None:
        if self.holder is not None:
            self.holder = None
            self.owner.dead += 1
            self.owner.maybe_compact()

    @property
    def alive(self) -> bool:
        return self.holder is not None

    def __repr__(self) -> str:
        return f"Lock(at={self.when}, alive={self.alive})"


Entry = Expiry | Due | Lock


class Timers:
    """A heap of message timers."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = count()
        self.dead = 0
        """Entries in the heap that nothing needs any more (rebuilt without them when they are many)."""

    def __len__(self) -> int:
        return len(self._heap)

    def expire(self, when: float, queues: tuple[Queue, ...], messages: list[Message]) -> Expiry:
        """The copies ``messages`` (one on each of ``queues``, one content) expire at ``when``."""
        entry = Expiry(self, when, queues, messages[0].content.key)
        for message in messages:
            message.timer = entry
        heapq.heappush(self._heap, (when, next(self._order), entry))
        return entry

    def due(self, when: float, items: list[tuple[Queue, Message]]) -> Due:
        """``items`` (scheduled on their queues) become visible at ``when``."""
        entry = Due(when, items)
        heapq.heappush(self._heap, (when, next(self._order), entry))
        return entry

    def lock(self, when: float, holder: Any) -> Lock:
        """A peek-lock on ``holder`` that runs out at ``when``."""
        entry = Lock(self, when, holder)
        heapq.heappush(self._heap, (when, next(self._order), entry))
        return entry

    def add(self, when: float, kind: TimerKind, queue: Queue, message: Message) -> Expiry | Due:
        """One timer for one message on one queue (its place in ``queue`` must be set already)."""
        if kind is TimerKind.EXPIRE:
            return self.expire(when, (queue,), [message])
        return self.due(when, [(queue, message)])

    def discard_message(self, message: Message) -> None:
        """Forget the timers of ``message``, taken back from its queue before anyone saw it. O(timers): only for
        that rare case."""
        if message.timer is not None:
            timer, message.timer = message.timer, None
            timer.left()
        for _, _, entry in self._heap:
            if isinstance(entry, Due) and any(m is message for _, m in entry.items):
                entry.items = [pair for pair in entry.items if pair[1] is not message]
                if not entry.items:
                    self.dead += 1

    def scheduled_on(self, queue: Queue) -> list[Message]:
        """The messages of ``queue`` waiting for their scheduled delivery time. O(timers): for a Service Bus
        peek-message only."""
        return [
            message
            for _, _, entry in self._heap
            if isinstance(entry, Due)
            for on, message in entry.items
            if on is queue and message.deliver_at is not None
        ]

    def scheduled(self, seq: int) -> list[tuple[Queue, Message]]:
        """The copies of the message placed at ``seq`` waiting for their scheduled delivery time (not those waiting
        out a redelivery delay). O(timers): for a Service Bus cancel-scheduled-message only."""
        return [
            (queue, message)
            for _, _, entry in self._heap
            if isinstance(entry, Due)
            for queue, message in entry.items
            if message.seq == seq and message.deliver_at is not None
        ]

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and not heap[0][2].alive:  # a dead entry never wakes anybody
            heapq.heappop(heap)
            self.dead = max(0, self.dead - 1)
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[Entry]:
        """Every live entry due at ``now``, in time order (each leaves the heap)."""
        due: list[Entry] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.alive:
                due.append(entry)
            else:
                self.dead = max(0, self.dead - 1)
        return due

    def queue_gone(self, queue: Queue) -> None:
        """``queue`` was deleted: its scheduled messages wait for nothing any more."""
        if queue.scheduled:
            self.dead += queue.scheduled
            self.maybe_compact()

    def maybe_compact(self) -> None:
        """Rebuild the heap without dead entries once they are at least half of it (amortised O(1) each)."""
        dead = self.dead
        if dead < _COMPACT_MIN or dead * 2 < len(self._heap):
            return
        kept = []
        for item in self._heap:
            entry = item[2]
            if isinstance(entry, Due):
                entry.items = [pair for pair in entry.items if not pair[0].deleted]
                if entry.items:
                    kept.append(item)
            elif entry.alive:
                kept.append(item)
        heapq.heapify(kept)
        self._heap = kept
        self.dead = 0
