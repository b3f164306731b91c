"""A queue node: ready messages in order, competing consumers, acquired counts (Part 3 §3.5).

Ready messages are ordered by arrival sequence, so a released message goes back to the place it had,
ahead of everything that arrived after it: FIFO holds across redelivery. Consumers compete: each
message goes to exactly one consumer, chosen round-robin among those with credit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sortedcontainers import SortedKeyList

from minibroker.broker.message import Message

if TYPE_CHECKING:
    from minibroker.broker.links import Consumer


def _order(message: Message) -> int:
    return message.seq


class Queue:
    """One queue node."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: SortedKeyList = SortedKeyList(key=_order)
        self.consumers: list[Consumer] = []
        self.acquired = 0
        self.staged = 0  # messages posted in open transactions, invisible until commit
        self._next_consumer = 0
        self.enqueued_total = 0

    @property
    def depth(self) -> int:
        """Messages ready for delivery."""
        return len(self.ready)

    def put(self, message: Message) -> None:
        """A new message arrives."""
        self.ready.add(message)
        self.enqueued_total += 1

    def requeue(self, message: Message) -> None:
        """An acquired message comes back (released, modified, or its consumer went away)."""
        self.acquired -= 1
        self.ready.add(message)

    def acquire(self) -> Message:
        """Take the first ready message for delivery."""
        self.acquired += 1
        message: Message = self.ready.pop(0)
        return message

    def purge(self) -> int:
        """Drop every ready message; return how many."""
        count = len(self.ready)
        self.ready.clear()
        return count

    def retire(self) -> None:
        """An acquired message is gone for good (accepted, rejected)."""
        self.acquired -= 1

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def next_consumer(self) -> Consumer | None:
        """The next consumer, round-robin, that can take a message now."""
        consumers = self.consumers
        n = len(consumers)
        for i in range(n):
            index = (self._next_consumer + i) % n
            consumer = consumers[index]
            if consumer.can_take():
                self._next_consumer = (index + 1) % n
                return consumer
        return None

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, ready={len(self.ready)}, acquired={self.acquired})"
