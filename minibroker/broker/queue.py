"""A queue: a store of messages in delivery order, with counts and limits (Part 3 §3.5).

Ready messages are ordered by (priority descending, arrival sequence): higher priority first, FIFO within a
priority (Part 3 §3.2.1 header.priority, 0-9, default 4). A released message goes back to the place it
had, ahead of everything that arrived after it. A queue knows nothing of links: who consumes from it, and
in which order, is ``dispatch.py``'s business.

A queue also serves as each subscription of a topic (``topic.py``), where ``node_name`` is the topic's.
Counts: ``ready`` (deliverable now), ``acquired`` (delivered, unsettled), ``scheduled`` (not yet visible:
a delivery time or a redelivery delay), ``staged`` (posted in open transactions). Limits count every
message held: ready, acquired and scheduled. Counters: ``enqueued_total`` (became ready) and ``dequeued_total``
(left for good, in ``_gone``).

A ``Scan`` is one reader's progress through the ready messages (a consumer with a selector, see
``dispatch.py``): how far in delivery order it has looked, plus the messages that came in behind that point
since (a release puts a message back at its old place, a higher priority goes ahead, a scheduled message
falls due). The queue keeps one log of the keys of such messages, which every open scan reads from its own
position, so a reader never has to look at a message twice, however deep the queue, and what is remembered
is bounded by the ready messages, not by readers times messages (a reader far behind starts over).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from sortedcontainers import SortedKeyList

from minibroker.broker.message import Message
from minibroker.broker.policy import NodePolicy

Departure = Callable[[Message], None]
"""What a queue calls when one of its journaled messages leaves it for good (accepted, rejected, expired, dropped,
purged): the journal recorder, which writes the removal down."""


def delivery_order(message: Message) -> tuple[int, int]:
    """Sort key of ready messages: higher priority first, then arrival (one tuple shared by every copy)."""
    return message.content.key


def _left(message: Message) -> None:
    """``message`` left its queue for good: its expiry timer need not hold anything for it any more."""
    timer = message.timer
    if timer is not None:
        message.timer = None
        timer.left()


class _Ready(SortedKeyList):  # type: ignore[misc]  # (sortedcontainers is untyped)
    """The ready messages, in ``delivery_order``: a ``SortedKeyList`` whose ``add`` appends at once a message that
    goes after every other (almost every arrival: the same priority, a rising sequence), in place of its bisection
    and index upkeep (issue 19: a third of ``put``'s cost). Anything else (a higher priority, a released message
    going back to its place, a full last sublist, a positional index built) takes ``SortedKeyList.add``; the
    fast path keeps the invariants that one keeps (sublists of at most twice the load, ``_maxes`` the last key of
    each, ``_len``), read from sortedcontainers 2.4's ``SortedKeyList.add`` and ``_expand``."""

    def __init__(self) -> None:
        super().__init__(key=delivery_order)

    def add(self, value: Message) -> None:
        key = value.content.key
        maxes = self._maxes
        if maxes and key > maxes[-1] and not self._index:
            keys = self._keys[-1]
            if len(keys) < self._load << 1:  # (``_expand`` would split it beyond that)
                keys.append(key)
                self._lists[-1].append(value)
                maxes[-1] = key
                self._len += 1
                return
        super().add(value)

    def first(self) -> Message | None:
        """The first message in delivery order, or None (sortedcontainers keeps no empty sublist): one call, in
        place of the ``__len__`` and ``__getitem__`` of ``ready[0]`` behind a truth test (per delivery, issue 19)."""
        lists = self._lists
        return lists[0][0] if lists else None

    def pop_first(self) -> Message:
        """Take the first message: ``pop(0)``, whose ``_delete`` only drops the first entry of the first sublist when
        more than half a load is left in it or it is the only one, and no positional index is built; done here
        without its calls in that case, the usual one (per delivery, issue 19)."""
        keys = self._keys[0]
        rest = len(keys) - 1
        if rest and not self._index and (rest > self._load >> 1 or len(self._keys) == 1):
            del keys[0]
            self._len -= 1
            message: Message = self._lists[0].pop(0)
            return message  # (``_maxes[0]``, the sublist's last key, is unchanged)
        popped: Message = self.pop(0)
        return popped


class _Arrivals:
    """The delivery-order keys of messages that became ready behind some scan's cursor, in arrival order: one log
    per queue, shared by its scans (each reads it from its own ``position``), so what came in costs one entry
    however many scans there are, and holds no message (a consumed message is freed at once)."""

    __slots__ = ("base", "keys")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.base = 0  # the log position of ``keys[0]`` (entries every scan has read are dropped)

    @property
    def end(self) -> int:
        return self.base + len(self.keys)

    def trim(self, position: int) -> None:
        """Forget the entries before ``position`` (every scan has read them)."""
        if position > self.base:
            del self.keys[: position - self.base]
            self.base = position


class Scan:
    """How far one reader has looked through a queue's ready messages, in delivery order.

    Every ready message at or before ``cursor`` (a ``delivery_order`` key; None: nothing yet) has been looked at,
    except those that became ready there since: the queue's log of such arrivals from ``position`` on, and the
    ones already read from it but not yet looked at (``pending``, a heap of keys). ``examined`` counts the
    messages looked at (tests use it to check that the work stays incremental).
    """

    __slots__ = ("_log", "cursor", "examined", "pending", "position")

    def __init__(self, log: _Arrivals) -> None:
        self._log = log
        self.cursor: tuple[int, int] | None = None
        self.position = log.end
        self.pending: list[tuple[int, int]] = []
        self.examined = 0

    @property
    def behind(self) -> list[tuple[int, int]]:
        """The keys of the messages that came in behind the cursor and are not yet looked at."""
        cursor = self.cursor
        if cursor is None:
            return []
        log = self._log
        return self.pending + [key for key in log.keys[self.position - log.base :] if key <= cursor]

    def next_behind(self) -> tuple[int, int] | None:
        """The first key in delivery order that came in behind the cursor (taken off the list), or None."""
        log = self._log
        if self.position < log.end:
            cursor = self.cursor
            if cursor is not None:
                pending = self.pending
                for key in log.keys[self.position - log.base :]:
                    if key <= cursor:
                        heapq.heappush(pending, key)
            self.position = log.end
        return heapq.heappop(self.pending) if self.pending else None

    def restart(self) -> None:
        """Look at everything again from the start (what was behind is ahead now)."""
        self.cursor = None
        self.pending.clear()
        self.position = self._log.end


_MADE = itertools.count()  # (queues numbered as they are made, across brokers: only their order matters)


class Queue:
    """One queue node (or one topic subscription)."""

    kind = "queue"

    def __init__(self, name: str, policy: NodePolicy | None = None, *, node_name: str | None = None) -> None:
        self.made = next(_MADE)
        """Its place among the queues made: the order one dispatch serves several in (``Dispatcher.dispatch_all``)."""
        self.name = name
        self.node_name = node_name or name
        self.policy = policy or NodePolicy()
        self.ready = _Ready()
        self.acquired = 0
        self.staged = 0  # messages posted in open transactions, invisible until commit
        self.scheduled = 0
        self.held_bytes = 0
        self.enqueued_total = 0
        self.dequeued_total = 0  # messages that left for good (``_gone``): consumed, dead-lettered, expired, purged
        self.dynamic = False  # created for a dynamic terminus; deleted with its link
        self.owner: object = None  # the connection that created a dynamic node: only it may receive from it
        self.auto = False  # created on demand: deleted once idle for ``auto_delete_idle``
        self.idle_since: float | None = None  # when an idle sweep first found it idle (with ``idle_mark``)
        self.idle_mark = 0  # ``enqueued_total`` at that sweep: anything enqueued since means it was not idle
        self.deleted = False  # its node (or subscription) is gone; pending timers for it are void
        self.on_departure: Departure | None = None  # told when a journaled message leaves; None: not journaled
        self.namespace: Any = None  # the namespace holding it (dead-letter queues are created there)
        self.scans: list[Scan] = []  # readers that look through the ready messages incrementally
        self._arrivals = _Arrivals()  # what came in behind their cursors

    @property
    def depth(self) -> int:
        """Messages ready for delivery."""
        return len(self.ready)

    @property
    def held(self) -> int:
        """Messages the queue holds: ready, acquired and scheduled."""
        return len(self.ready) + self.acquired + self.scheduled

    @property
    def journaled(self) -> bool:
        """True when the queue's durable messages are journaled (it reports their departures)."""
        return self.on_departure is not None

    def has_room(self, message: Message, extra: int = 0, extra_bytes: int = 0) -> bool:
        """True when ``message`` (after ``extra`` others of ``extra_bytes``) fits the node's limits."""
        policy = self.policy
        if not policy.max_messages and not policy.max_bytes:
            return True
        held = self.held - self.acquired if policy.limit_ready else self.held
        return policy.admits(held + extra, self.held_bytes + extra_bytes, message.size)

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
        for scan in self.scans:
            cursor = scan.cursor
            if cursor is not None and key <= cursor:
                break
        else:
            return  # ahead of every cursor: each scan will come to it
        log = self._arrivals
        log.keys.append(key)
        limit = 2 * len(self.ready) + 64
        if len(log.keys) > limit:
            log.trim(min(scan.position for scan in self.scans))
            if len(log.keys) > limit:
                # readers that have not looked for long: cheaper to start them again than to remember
                lagging = log.base + len(log.keys) // 2
                for scan in self.scans:
                    if scan.position < lagging:
                        scan.restart()
                log.trim(min(scan.position for scan in self.scans))

    def next_behind(self, scan: Scan) -> Message | None:
        """The first ready message (delivery order) that came in behind ``scan``'s cursor and that it has not
        looked at, or None."""
        if len(scan.pending) > 2 * len(self.ready) + 64:
            scan.restart()  # it read much and took little: start again rather than hold on
            return None
        ready = self.ready
        while (key := scan.next_behind()) is not None:
            message: Message | None = next(iter(ready.irange_key(key, key)), None)
            if message is not None:  # (it may have gone since: taken by another consumer, expired)
                return message
        return None

    def open_scan(self) -> Scan:
        """A new reader, told from now on of the messages that come in behind its cursor."""
        scan = Scan(self._arrivals)
        self.scans.append(scan)
        return scan

    def close_scan(self, scan: Scan) -> None:
        if scan in self.scans:
            self.scans.remove(scan)
            if self.scans:
                self._arrivals.trim(min(other.position for other in self.scans))
            else:
                self._arrivals.trim(self._arrivals.end)

    def acquire(self, message: Message) -> None:
        """``message`` (ready) is handed to a consumer."""
        self.ready.remove(message)
        self.acquired += 1

    def acquire_first(self) -> Message:
        """Take the first ready message for delivery."""
        self.acquired += 1
        return self.ready.pop_first()

    def retire(self, message: Message) -> None:
        """An acquired message is gone for good (accepted, rejected, dead-lettered)."""
        self.acquired -= 1
        self.held_bytes -= message.size
        self._gone(message)

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
        self._gone(message)

    def remove_ready(self, message: Message) -> bool:
        """Take ``message`` out of the ready messages (expired, dropped); False if it is not there."""
        try:
            self.ready.remove(message)
        except ValueError:
            return False
        self.held_bytes -= message.size
        self._gone(message)
        return True

    def purge(self) -> int:
        """Drop every ready message; return how many."""
        count = len(self.ready)
        for message in self.ready:
            self.held_bytes -= message.size
            self._gone(message)
        self.ready.clear()
        for scan in self.scans:
            scan.restart()
        return count

    def _gone(self, message: Message) -> None:
        """``message`` left the queue for good: its timer is let go, its departure reported if it was journaled."""
        self.dequeued_total += 1
        if message.timer is not None:
            _left(message)
        if message.durable_id and self.on_departure is not None:
            self.on_departure(message)

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
