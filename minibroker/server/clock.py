"""Broker time: what the broker's timers run on, real or virtual (issue 16 §2, "Virtual time").

The broker core reads no clock (DESIGN §3): the trio layer hands it ``now`` with every event and every timer
call. ``BrokerTime`` is where that ``now`` comes from. On the real clock (the default) it is trio's clock itself,
so a test under ``MockClock`` drives every timer as before. On the virtual clock (``--clock virtual``, ``[broker]
clock = "virtual"``) it starts at trio's time and then moves only when told: ``advance(seconds)``, from Python or
from ``POST /api/clock/advance``. An advance fires every timer that falls due on the way, in deadline order, each
at its own instant, before it returns: a timer that fires schedules the next one inside the same advance (the
idle-node sweep, every 150 s with ``auto_delete_idle = 300``, runs at 150, 300, 450 s... within an advance of 1000 s,
and deletes the idle node as real time would have).

What runs on broker time: every broker timer. Transaction time-outs, ttl and absolute-expiry-time, scheduled
delivery, redelivery delays, the idle-node sweep, and whatever later timer the core keeps (all of them read the
core's one ``now``). Wall-clock message fields map onto broker time through the core's ``WallClock``, whose offset
is taken once at start, so an absolute-expiry-time of "in an hour" expires when virtual time passes it.

What stays on real (trio) time, on purpose: the timers that protect the process and its peers. The SASL/open
handshake time-out, the idle time-out and heartbeats (the engine's, fed ``trio.current_time()``), HTTP request
time-outs, login throttling, the flush grace of a closing connection, ``wait_for`` time-outs. A peer connected to
a virtual-time broker still gets its heartbeats, and a silent socket is still dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from minibroker.broker.core import Broker
from minibroker.config import CLOCK_MODES
from minibroker.server.connection import fire_timers

log = logging.getLogger("minibroker.clock")

MAX_ADVANCE = 100 * 365 * 86400.0
"""Most seconds one advance moves virtual time (a century: wall-clock message fields stay in range)."""
_MAX_FIRINGS_AT_ONE_INSTANT = 1000
"""Timer rounds an advance runs at one instant before it moves on (a deadline that firing does not clear is a bug
in the core, contained and logged: it must not hang the advance)."""


class BrokerTime:
    """The clock of one broker's timers: ``mode`` "real" or "virtual".

    ``time()`` is broker time on trio's timescale (what the core is handed as ``now``); ``now`` is the same instant
    as wall-clock seconds since the epoch (what ``GET /api/clock`` says); ``advance(seconds)`` moves virtual time.
    """

    def __init__(self, broker: Broker, mode: str = "real") -> None:
        if mode not in CLOCK_MODES:
            raise ValueError(f"clock: {mode!r} is not one of {', '.join(CLOCK_MODES)}")
        self.mode = mode
        self._broker = broker
        self._virtual = trio.current_time()
        self.time: Callable[[], float] = trio.current_time if mode == "real" else self._virtual_time
        """Broker time on trio's timescale: ``trio.current_time`` itself on the real clock."""
        self.woken: Callable[[], None] = _nothing
        """Told after an advance: the timer task re-reads the next deadline (``run_broker_timer`` sets it)."""

    def _virtual_time(self) -> float:
        return self._virtual

    @property
    def now(self) -> float:
        """Broker time as wall-clock seconds since the epoch."""
        return self.time() + self._broker.clock.wall.offset

    def wake_at(self, deadline: float | None) -> float:
        """The trio instant at which the timer task must wake for ``deadline`` (broker time): the deadline itself on
        the real clock; on the virtual clock at once when it is due, else never (an advance wakes it)."""
        if deadline is None:
            return math.inf
        if self.mode == "real":
            return deadline
        return -math.inf if deadline <= self._virtual else math.inf

    def advance(self, seconds: float) -> float:
        """Move virtual time ``seconds`` forward, firing every timer due on the way in deadline order, each at its
        own instant; return the new ``now``. ``ValueError`` for a negative ``seconds`` or more than ``MAX_ADVANCE``,
        ``RuntimeError`` on the real clock."""
        if self.mode != "virtual":
            raise RuntimeError(
                "the broker's clock is real: only a broker started with --clock virtual "
                '([broker] clock = "virtual") can be advanced'
            )
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"seconds: expected a number, got {seconds!r}")
        if seconds < 0:
            raise ValueError(f"seconds: time only moves forward ({seconds!r} is negative)")
        if not seconds <= MAX_ADVANCE:  # (NaN is never)
            raise ValueError(f"seconds: at most {MAX_ADVANCE:g} (a century) at once, got {seconds!r}")
        broker = self._broker
        target = self._virtual + seconds
        rounds = 0
        while (deadline := broker.next_deadline()) is not None and deadline <= target:
            if deadline > self._virtual:
                self._virtual, rounds = deadline, 0
            rounds += 1
            if rounds > _MAX_FIRINGS_AT_ONE_INSTANT:
                log.error("a broker timer stays due at %.3f after %d rounds; the advance goes on", deadline, rounds)
                break
            fire_timers(broker, self._virtual)
        self._virtual = target
        fire_timers(broker, target)  # the core works at the new instant (transaction ages, new deadlines)
        self.woken()
        return self.now

    def __repr__(self) -> str:
        return f"BrokerTime(mode={self.mode!r}, now={self.now:.3f})"


def _nothing() -> None:
    pass


__all__ = ["BrokerTime"]
