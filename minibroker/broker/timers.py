"""Message timers: expiry and scheduled visibility, on the broker's clock (see ``clock.py``).

One heap for the whole broker. Entries are never removed early: when one comes due, the broker checks
that it still applies (the message may have been consumed, or expired, meanwhile), so cancelling costs
nothing on the hot path.
"""

from __future__ import annotations

import heapq
from enum import Enum
from itertools import count
from typing import NamedTuple

from minibroker.broker.message import Message
from minibroker.broker.queue import Queue


class TimerKind(Enum):
    EXPIRE = "expire"  # the message's ttl or absolute-expiry-time has passed
    DUE = "due"  # a scheduled (or redelivery-delayed) message becomes visible


class Timer(NamedTuple):
    when: float
    order: int
    kind: TimerKind
    queue: Queue
    message: Message


class Timers:
    """A heap of message timers."""

    def __init__(self) -> None:
        self._heap: list[Timer] = []
        self._order = count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, when: float, kind: TimerKind, queue: Queue, message: Message) -> None:
        heapq.heappush(self._heap, Timer(when, next(self._order), kind, queue, message))

    def next_deadline(self) -> float | None:
        return self._heap[0].when if self._heap else None

    def pop_due(self, now: float) -> list[Timer]:
        """Every timer due at ``now``, in time order."""
        due = []
        heap = self._heap
        while heap and heap[0].when <= now:
            due.append(heapq.heappop(heap))
        return due

    def discard_message(self, message: Message) -> None:
        """Forget the timers of ``message`` (taken back from its queue: a publish the journal refused). O(timers):
        only for that rare case."""
        self._heap = [t for t in self._heap if t.message is not message]
        heapq.heapify(self._heap)

    def discard_queue(self, queue: Queue) -> None:
        """Forget the timers of a deleted queue."""
        self._heap = [t for t in self._heap if t.queue is not queue]
        heapq.heapify(self._heap)
