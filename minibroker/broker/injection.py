"""What a fault hook needs from the core (issue 16 §1): the rules, a way to run a step later, a way to drop a
connection.

The hooks in ``endpoints.py``, ``coordinator.py`` and ``dispatch.py`` each hold the core's ``Injection`` and start
with ``if self.injection.rules:``, a list that is empty unless a rule was added (``faults.py``). A delayed action
(``delay``, a ``close`` after a delay) is a step put on this object's heap, run by the core's ``handle_timeout`` at
broker time ``when`` (``next_deadline`` counts it), so a test moving the clock moves it too. Dropping a connection
is the engine's ``drop`` (no close frame; the I/O layer then closes the socket), handed in by the core so that the
events it causes are handled as any closed connection's.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from minibroker.broker.clock import BrokerClock
from minibroker.broker.faults import FaultRule, Faults
from minibroker.engine.connection import ServerConnection

Step = Callable[[], None]
Contain = Callable[[str, Step], bool]


class Injection:
    """The fault rules of a broker, and the core's help to apply them."""

    def __init__(
        self,
        faults: Faults | None = None,
        clock: BrokerClock | None = None,
        new_deadline: Callable[[], None] | None = None,
        drop: Callable[[ServerConnection], None] | None = None,
    ) -> None:
        self.faults = faults or Faults()
        self.rules = self.faults.rules
        """Empty unless a rule exists: the one test a hook makes."""
        self.clock = clock or BrokerClock()
        self._new_deadline = new_deadline
        self._drop = drop
        self._steps: list[tuple[float, int, Step]] = []
        self._ties = itertools.count()

    def fire(self, point: str, conn: ServerConnection | None = None, address: str | None = None) -> FaultRule | None:
        """The rule that fires on this event, or None (see ``Faults.fire``)."""
        return self.faults.fire(point, conn, address)

    def drop(self, conn: ServerConnection) -> None:
        """Cut ``conn`` without a close frame: its links detach and its transactions roll back as for a lost
        connection."""
        if self._drop is not None:
            self._drop(conn)
        else:
            conn.drop()

    def later(self, delay: float, step: Step) -> None:
        """Run ``step`` ``delay`` seconds of broker time from now."""
        when = self.clock.now + delay
        first = not self._steps or when < self._steps[0][0]
        heapq.heappush(self._steps, (when, next(self._ties), step))
        if first and self._new_deadline is not None:
            self._new_deadline()

    def next_deadline(self) -> float | None:
        return self._steps[0][0] if self._steps else None

    def run_due(self, now: float, contain: Contain) -> None:
        """Run every step due at ``now``, each on its own (an error in one is logged, the others run)."""
        steps = self._steps
        while steps and steps[0][0] <= now:
            contain("a delayed fault action", heapq.heappop(steps)[2])
