"""The one place where wall-clock time meets the broker's clock (DESIGN §3: the core reads no clock).

Every broker timer (expiry, scheduled delivery, redelivery delay, transaction time-out) runs on the
``now`` the I/O layer passes in: trio's clock, so a test can drive them all with ``MockClock``. Some
message fields are wall-clock instants in milliseconds (``absolute-expiry-time``, ``x-opt-delivery-time``,
``x-opt-scheduled-enqueue-time``); ``WallClock`` maps them onto the broker's clock with one offset, taken
once by whoever starts the broker. ``BrokerClock`` is the instant the core is working at, shared by its
components and moved only by the core's entry points.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WallClock:
    """``wall time = broker time + offset`` (seconds)."""

    offset: float = 0.0

    def from_wall_ms(self, wall_ms: int | float) -> float:
        """The broker-clock instant of a wall-clock time in milliseconds since the epoch."""
        return wall_ms / 1000 - self.offset


class BrokerClock:
    """The broker-clock instant being handled (``now``) and the wall-clock mapping."""

    __slots__ = ("now", "wall")

    def __init__(self, wall: WallClock | None = None) -> None:
        self.now = 0.0
        self.wall = wall or WallClock()

    def from_wall_ms(self, wall_ms: int | float) -> float:
        return self.wall.from_wall_ms(wall_ms)

    def wall_ms(self, at: float | None = None) -> int:
        """The wall-clock time in milliseconds since the epoch of the broker-clock instant ``at`` (default: now)."""
        return round(((self.now if at is None else at) + self.wall.offset) * 1000)

    def move_to(self, now: float) -> None:
        """The I/O layer's instant for a command that comes with no event (a management call: a post, a purge), so
        that it does not run at the instant of the last event (a message posted with a ttl an hour after the last
        event must not expire at once). Never backwards."""
        if now > self.now:
            self.now = now
