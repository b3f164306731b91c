"""Service Bus message sessions in the broker core (issue 17 item 8): which receiver holds which session, the
session locks, and the session states. The wire shapes are ``minibroker.servicebus.sessions``.

Theory of operation
-------------------
A message's session is its ``properties.group-id`` (azure-servicebus sends ``ServiceBusMessage.session_id``
there). A Service Bus receiver gets a ``SessionGate`` (``session_gate.py``) as its selector: the gate of a
session receiver admits the messages of its session only; on an entity nobody configured, the gate of a plain
receiver admits the messages without a session only (so sessions and plain messages may share a queue there
without mixing). ``dispatch.py`` serves gated receivers as it serves receivers with a selector (``Scan``: each
ready message looked at once).

``Sessions`` owns the relation session -> receiver: a session is held by at most one receiver at a time
(``claim``); a receiver asking for the next available session gets the session of the first ready message (in
delivery order) that nobody holds. A held session has a lock that runs out on the broker clock after the entity's
lock duration (a ``timers.Lock`` whose holder is the ``SessionLock``; ``renew`` extends it); what happens then to
the receiver and its messages is ``Dispatcher``'s (it detaches the link with ``session-lock-lost``). A receiver
that detaches gives its session up at once (``release``). A receiver asking for the next available session while
none is waits, its attach unanswered, for as long as it says (``wait``, ``offer``, ``timed_out``; the endpoints
answer or refuse it through ``granted`` and ``wait_over``).

The state of a session (bytes) is kept per queue and session id whether or not the session has messages or a
receiver, with the broker time it was last set (``get-message-sessions`` filters on it); it goes with its queue.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from minibroker.amqp.definitions import Error
from minibroker.broker.clock import BrokerClock
from minibroker.broker.message import Message
from minibroker.broker.queue import Queue
from minibroker.broker.session_gate import SessionGate, group_id
from minibroker.broker.timers import Lock, Timers
from minibroker.servicebus import sessions as sb_sessions
from minibroker.servicebus.sessions import session_key

if TYPE_CHECKING:
    from minibroker.broker.links import Consumer


def missing_session(requires_session: bool, message: Message) -> Error | None:
    """The refusal of a message without a session id sent to an entity that requires sessions (as Service Bus
    refuses it, an invalid operation: ``amqp:not-allowed``), or None."""
    if not requires_session or group_id(message) is not None:
        return None
    return sb_sessions.error(
        sb_sessions.NOT_ALLOWED,
        "The SessionId was not set on a message, and it cannot be sent to the entity: it requires sessions",
    )


class SessionLock:
    """One held session: its queue, id, holder and the end of its lock on the broker clock."""

    __slots__ = ("consumer", "queue", "session_id", "timer")

    def __init__(self, queue: Queue, session_id: str, consumer: Consumer) -> None:
        self.queue = queue
        self.session_id = session_id
        self.consumer = consumer
        self.timer: Lock | None = None

    @property
    def until(self) -> float:
        return self.timer.when if self.timer is not None else 0.0


class Waiter:
    """A receiver asking for the next available session while none is: its attach waits unanswered until a
    session becomes available or its ``timer`` runs out. ``context`` is the attach's (``endpoints.py``)."""

    __slots__ = ("consumer", "context", "timer")

    def __init__(self, consumer: Consumer, context: object) -> None:
        self.consumer = consumer
        self.context = context
        self.timer: Lock | None = None


def _nothing(*_: object) -> None:  # pragma: no cover - replaced by the endpoints
    pass


class Sessions:
    """The sessions of one broker: who holds each, their locks, their states, and who waits for one."""

    def __init__(self, clock: BrokerClock, timers: Timers, new_deadline: Callable[[], None]) -> None:
        self.clock = clock
        self.timers = timers
        self._new_deadline = new_deadline
        self._held: dict[tuple[Queue, str], SessionLock] = {}
        """By queue and ``session_key`` (session ids are not case-sensitive)."""
        self._states: dict[Queue, dict[str, tuple[str, bytes, float]]] = {}
        """By queue and ``session_key``: the session id as last set, the state, when it was set."""
        self.waiting: dict[Queue, list[Waiter]] = {}
        """Receivers waiting for the next available session of a queue, first come first served."""
        self.granted: Callable[[Waiter, SessionLock], None] = _nothing
        """Told when a waiting receiver got a session (the endpoints answer its attach)."""
        self.wait_over: Callable[[Waiter], None] = _nothing
        """Told when a receiver waited in vain, or its link went away while it waited (the endpoints refuse it
        with ``com.microsoft:timeout``, or forget it)."""

    # -- waiting for a session ----------------------------------------------------------------------
    def wait(self, consumer: Consumer, context: object, until: float) -> None:
        """``consumer`` waits until ``until`` (broker time) for a session of its queue to become available."""
        waiter = Waiter(consumer, context)
        waiter.timer = self.timers.lock(until, waiter)
        self._new_deadline()
        self.waiting.setdefault(consumer.queue, []).append(waiter)

    def offer(self, queue: Queue, lock_duration: float, alive: Callable[[Consumer], bool]) -> None:
        """Give the sessions of ``queue`` available now to its waiting receivers, in the order they came; those
        whose link went away meanwhile are let go (``wait_over``). Re-entrant: ``granted`` dispatches the queue."""
        waiters = self.waiting.get(queue)
        while waiters:
            waiter = waiters[0]
            living = alive(waiter.consumer)
            session_id = self._available(queue) if living else None
            if living and session_id is None:
                break
            self._stop_waiting(waiter)
            if session_id is None:
                self.wait_over(waiter)
                continue
            lock = self.claim(waiter.consumer, session_id, lock_duration)
            assert isinstance(lock, SessionLock)  # (available: nobody holds it)
            self.granted(waiter, lock)

    def _stop_waiting(self, waiter: Waiter) -> bool:
        """Take ``waiter`` off the waiting receivers; whether it was one."""
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        queue = waiter.consumer.queue
        waiters = self.waiting.get(queue)
        if waiters is None or waiter not in waiters:
            return False
        waiters.remove(waiter)
        if not waiters:
            del self.waiting[queue]
        return True

    def timed_out(self, waiter: Waiter) -> None:
        """The time ``waiter`` waited for a session ran out."""
        if self._stop_waiting(waiter):
            self.wait_over(waiter)

    # -- holding sessions ---------------------------------------------------------------------------
    def claim(self, consumer: Consumer, wanted: str | None, lock_duration: float) -> SessionLock | Error:
        """Lock a session of ``consumer``'s queue for it: ``wanted``, or (None) the next available one. The error
        when ``wanted`` is held by another receiver (``session-cannot-be-locked``) or no session is available
        (``com.microsoft:timeout``: the SDK raises ``OperationTimeoutError``, as when Service Bus finds none in
        the receiver's time)."""
        queue = consumer.queue
        session_id = wanted if wanted is not None else self._available(queue)
        if session_id is None:
            return sb_sessions.error(sb_sessions.TIMEOUT, "no session is available: none has messages and no lock")
        if (queue, session_key(session_id)) in self._held:
            return sb_sessions.error(
                sb_sessions.SESSION_CANNOT_BE_LOCKED,
                f"session {session_id!r} is locked by another receiver",
            )
        lock = self._held[(queue, session_key(session_id))] = SessionLock(queue, session_id, consumer)
        self._lock_until(lock, self.clock.now + lock_duration)
        return lock

    def _available(self, queue: Queue) -> str | None:
        """The session of the first ready message (delivery order) that nobody holds. O(ready messages)."""
        for message in queue.ready:
            found = group_id(message)
            if found is not None and (queue, session_key(found)) not in self._held:
                return found
        return None

    def _lock_until(self, lock: SessionLock, until: float) -> None:
        if lock.timer is not None:
            lock.timer.cancel()
        lock.timer = self.timers.lock(until, lock)
        self._new_deadline()

    def holder(self, queue: Queue, session_id: str) -> Consumer | None:
        lock = self._held.get((queue, session_key(session_id)))
        return lock.consumer if lock is not None else None

    def renew(self, queue: Queue, session_id: str, lock_duration: float, holders: Collection[Consumer]) -> float | None:
        """Extend the lock of a session held by one of ``holders`` (the requesting connection's receivers) for
        another lock duration from now: its new end, or None when none of them holds it."""
        lock = self._held.get((queue, session_key(session_id)))
        if lock is None or lock.consumer not in holders:
            return None
        until = self.clock.now + lock_duration
        self._lock_until(lock, until)
        return until

    def lock_of(self, consumer: Consumer) -> SessionLock | None:
        """The lock of the session ``consumer`` holds, or None (no session receiver, or its session was lost)."""
        gate = consumer.selector
        if not isinstance(gate, SessionGate) or gate.session_id is None:
            return None
        lock = self._held.get((consumer.queue, gate.key or ""))
        return lock if lock is not None and lock.consumer is consumer else None

    def release(self, consumer: Consumer) -> None:
        """``consumer`` gives its session up (its link detached), if it still holds one."""
        lock = self.lock_of(consumer)
        if lock is not None:
            self._drop(lock)

    def expired(self, lock: SessionLock) -> bool:
        """The timer of ``lock`` fired: whether it still held its session (which is now let go)."""
        if self._held.get((lock.queue, session_key(lock.session_id))) is not lock:
            return False
        self._drop(lock)
        return True

    def _drop(self, lock: SessionLock) -> None:
        del self._held[(lock.queue, session_key(lock.session_id))]
        if lock.timer is not None:
            lock.timer.cancel()
            lock.timer = None

    # -- state --------------------------------------------------------------------------------------
    def state(self, queue: Queue, session_id: str) -> bytes | None:
        kept = self._states.get(queue, {}).get(session_key(session_id))
        return kept[1] if kept is not None else None

    def set_state(self, queue: Queue, session_id: str, state: bytes | None) -> None:
        """Keep ``state`` for the session (None: forget it)."""
        if state is None:
            states = self._states.get(queue)
            if states is not None:
                states.pop(session_key(session_id), None)
                if not states:
                    del self._states[queue]
            return
        self._states.setdefault(queue, {})[session_key(session_id)] = (session_id, state, self.clock.now)

    def listed(self, queue: Queue, updated_after: float | None) -> list[str]:
        """The sessions of ``queue`` to list: with ``updated_after`` (broker time), those whose state was set
        since; else those with messages (ready, or out on a session receiver) or a state, each once whatever the
        casings its id came in. Sorted by id."""
        states = self._states.get(queue, {}).values()
        if updated_after is not None:
            return sorted(s for s, _, when in states if when > updated_after)
        found: dict[str, str] = {}
        ids = [s for s, _, _ in states] + [s for m in queue.ready if (s := group_id(m)) is not None]
        ids += [lock.session_id for lock in self._held.values() if lock.queue is queue and lock.consumer.unsettled]
        for session_id in ids:
            found.setdefault(session_key(session_id), session_id)
        return sorted(found.values())

    def queue_gone(self, queue: Queue) -> None:
        """``queue`` was deleted: its states go with it (its receivers are detached, and so release their
        sessions); its waiting receivers wait in vain."""
        self._states.pop(queue, None)
        for waiter in list(self.waiting.get(queue, ())):
            self.timed_out(waiter)
