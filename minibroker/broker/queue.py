"""A queue: a store of messages in delivery order, with counts and limits (Part 3 §3.5).

Ready messages are ordered by (priority descending, arrival sequence): higher priority first, FIFO within a
priority (Part 3 §3.2.1 header.priority, 0-9, default 4). A released message goes back to the place it
had, ahead of everything that arrived after it. A queue knows nothing of links: who consumes from it, and
in which order, is ``dispatch.py``'s business.

A queue also serves as each subscription of a topic (``topic.py``), where ``node_name`` is the topic's.
Counts: ``ready`` (deliverable now), ``acquired`` (delivered, unsettled), ``scheduled`` (not yet visible:
a delivery time or a redelivery delay), ``staged`` (posted in open transactions). Limits count every
message held: ready, acquired and scheduled.

A ``Scan`` is one reader's progress through the ready messages (a consumer with a selector, see
``dispatch.py``): how far in delivery order it has looked, plus the messages that came in behind that point
since (a release puts a message back at its old place, a higher priority goes ahead, a scheduled message
falls due). The queue tells every open scan of each such message, so a reader never has to look at a
message twice, however deep the queue.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Protocol

from sortedcontainers import SortedKeyList

from minibroker.broker.message import Message
from minibroker.broker.policy import NodePolicy


class Departures(Protocol):
    """Told when a journaled message leaves a queue for good (the journal recorder)."""

    def removed(self, queue: Queue, message: Message) -> None: ...


def delivery_order(message: Message) -> tuple[int, int]:
    """Sort key of ready messages: higher priority first, then arrival (one tuple shared by every copy)."""
    return message.content.key


def _left(message: Message) -> None:
    """``message`` left its queue for good: its expiry timer need not hold anything for it any more."""
    timer = message.timer
    if timer is not None:
        message.timer = None
        timer.left()


class Scan:
    """How far one reader has looked through a queue's ready messages, in delivery order.

    Every ready message at or before ``cursor`` (a ``delivery_order`` key; None: nothing yet) has been looked at,
    except those in ``behind``: messages that became ready there since, in delivery order (a heap).
    ``examined`` counts the messages looked at (tests use it to check that the work stays incremental).
    """

    __slots__ = ("_ties", "behind", "cursor", "examined")

    def __init__(self) -> None:
        self.cursor: tuple[int, int] | None = None
        self.behind: list[tuple[tuple[int, int], int, Message]] = []
        self.examined = 0
        self._ties = itertools.count()

    def came_in(self, key: tuple[int, int], message: Message) -> None:
        """``message`` (of delivery-order ``key``) became ready; remembered if it is behind the cursor."""
        if self.cursor is not None and key <= self.cursor:
            heapq.heappush(self.behind, (key, next(self._ties), message))

    def next_behind(self) -> Message | None:
        """The first message in delivery order that came in behind the cursor (taken off the list), or None."""
        if not self.behind:
            return None
        return heapq.heappop(self.behind)[2]

    def restart(self) -> None:
        """Look at everything again from the start (what was behind is ahead now)."""
        self.cursor = None
        self.behind.clear()


class Queue:
    """One queue node (or one topic subscription)."""

    kind = "queue"

    def __init__(self, name: str, policy: NodePolicy | None = None, *, node_name: str | None = None) -> None:
        self.name = name
        self.node_name = node_name or name
        self.policy = policy or NodePolicy()
        self.ready: SortedKeyList = SortedKeyList(key=delivery_order)
        self.acquired = 0
        self.staged = 0  # messages posted in open transactions, invisible until commit
        self.scheduled = 0
        self.held_bytes = 0
        self.enqueued_total = 0
        self.dynamic = False  # created for a dynamic terminus; deleted with its link
        self.owner: object = None  # the connection that created a dynamic node: only it may receive from it
        self.auto = False  # created on demand: deleted once idle for ``auto_delete_idle``
        self.idle_since: float | None = None  # when an idle sweep first found it idle (with ``idle_mark``)
        self.idle_mark = 0  # ``enqueued_total`` at that sweep: anything enqueued since means it was not idle
        self.deleted = False  # its node (or subscription) is gone; pending timers for it are void
        self.journal: Departures | None = None  # told when a journaled message leaves; None: not durable
        self.namespace: Any = None  # the namespace holding it (dead-letter queues are created there)
        self.scans: list[Scan] = []  # readers that look through the ready messages incrementally

    @property
    def depth(self) -> int:
        """Messages ready for delivery."""
        return len(self.ready)

    @property
    def held(self) -> int:
        """Messages the queue holds: ready, acquired and scheduled."""
        return len(self.ready) + self.acquired + self.scheduled

    def has_room(self, message: Message, extra: int = 0, extra_bytes: int = 0) -> bool:
        """True when ``message`` (after ``extra`` others of ``extra_bytes``) fits the node's limits."""
        policy = self.policy
        if not policy.max_messages and not policy.max_bytes:
            return True
        return policy.admits(self.held + extra, self.held_bytes + extra_bytes, message.size)

    def put(self, message: Message) -> None:
        """A message becomes ready (new, or due after being scheduled)."""
        self.ready.add(message)
        self.held_bytes += message.size
        self.enqueued_total += 1
        if self.scans:
            self._came_in(message)

    def requeue(self, message: Message) -> None:
        """An acquired message comes back (released, modified, or its consumer went away)."""
        self.acquired -= 1
        self.ready.add(message)
        if self.scans:
            self._came_in(message)

    def _came_in(self, message: Message) -> None:
        key = delivery_order(message)
        limit = 2 * len(self.ready) + 64
        for scan in self.scans:
            scan.came_in(key, message)
            if len(scan.behind) > limit:
                scan.restart()  # a reader that has not looked for long: cheaper to start again than to remember

    def open_scan(self) -> Scan:
        """A new reader, told from now on of the messages that come in behind its cursor."""
        scan = Scan()
        self.scans.append(scan)
        return scan

    def close_scan(self, scan: Scan) -> None:
        if scan in self.scans:
            self.scans.remove(scan)

    def acquire(self, message: Message) -> None:
        """``message`` (ready) is handed to a consumer."""
        self.ready.remove(message)
        self.acquired += 1

    def acquire_first(self) -> Message:
        """Take the first ready message for delivery."""
        self.acquired += 1
        message: Message = self.ready.pop(0)
        return message

    def retire(self, message: Message) -> None:
        """An acquired message is gone for good (accepted, rejected, dead-lettered)."""
        self.acquired -= 1
        self.held_bytes -= message.size
        if message.timer is not None:
            _left(message)
        if message.durable_id and self.journal is not None:
            self.journal.removed(self, message)

    def unacquire_for_later(self, message: Message) -> None:
        """An acquired message waits out a redelivery delay (it is counted as scheduled meanwhile)."""
        self.acquired -= 1
        self.held_bytes -= message.size
        self.hold_scheduled(message)

    def hold_scheduled(self, message: Message) -> None:
        self.scheduled += 1
        self.held_bytes += message.size

    def release_scheduled(self, message: Message) -> None:
        self.scheduled -= 1
        self.held_bytes -= message.size

    def drop_scheduled(self, message: Message) -> None:
        """A scheduled message is gone for good before it became visible (it expired while it waited)."""
        self.release_scheduled(message)
        if message.timer is not None:
            _left(message)
        if message.durable_id and self.journal is not None:
            self.journal.removed(self, message)

    def remove_ready(self, message: Message) -> bool:
        """Take ``message`` out of the ready messages (expired, dropped); False if it is not there."""
        try:
            self.ready.remove(message)
        except ValueError:
            return False
        self.held_bytes -= message.size
        if message.timer is not None:
            _left(message)
        if message.durable_id and self.journal is not None:
            self.journal.removed(self, message)
        return True

    def purge(self) -> int:
        """Drop every ready message; return how many."""
        count = len(self.ready)
        for message in self.ready:
            self.held_bytes -= message.size
            if message.timer is not None:
                _left(message)
            if message.durable_id and self.journal is not None:
                self.journal.removed(self, message)
        self.ready.clear()
        for scan in self.scans:
            scan.restart()
        return count

    def drop(self) -> None:
        """The queue is deleted: let its ready messages go (nothing is journaled: the node itself is gone)."""
        self.deleted = True
        for message in self.ready:
            if message.timer is not None:
                _left(message)
        self.held_bytes -= sum(message.size for message in self.ready)
        self.ready.clear()

    def __repr__(self) -> str:
        return f"Queue({self.name!r}, ready={len(self.ready)}, acquired={self.acquired})"
