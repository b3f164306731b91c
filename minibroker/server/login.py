"""SASL PLAIN checks off the event loop: the trio side of ``minibroker.auth``.

The engine hands over the credentials (``SaslPolicy.deferred``) and waits for a verdict. ``LoginChecker``
asks the throttle first (failed logins per peer address and per user), then checks the password in a worker
thread, at most ``auth.hash_threads`` at once: a PBKDF2 hash takes ~0.3 s of CPU, which on the loop would
stall every other connection, and which an unknown user costs as much as a known one. Checks queue for the
threads one per peer address at a time, so addresses are served in turn. A login that gives up before its
check ran (its handshake time ran out while it waited for a thread) is not counted as a failure.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from minibroker.auth import LoginThrottle, PasswordBook

log = logging.getLogger("minibroker.auth")


class LoginChecker:
    """Checks PLAIN credentials for every connection of one broker."""

    def __init__(self, book: PasswordBook, throttle: LoginThrottle, *, threads: int, failure_delay: float) -> None:
        self.book = book
        self.throttle = throttle
        self.failure_delay = failure_delay
        self.limiter = trio.CapacityLimiter(threads)
        """Password checks running at once (each in a worker thread)."""
        self._lanes: dict[str, _Lane] = {}
        """Per peer address, the lock its checks take before they queue for a thread (see ``_lane``)."""

    async def verify(self, user: str, password: str, address: str | None) -> tuple[bool, float]:
        """Whether the password is right, and the seconds to wait before answering (0 when it is)."""
        throttled = self.throttle.admit(address, user, trio.current_time())
        if throttled is not None:
            # one line when an address or a user starts being refused, not one per guess
            log.log(
                logging.WARNING if throttled.first else logging.DEBUG,
                "login as %r from %s refused unchecked: too many failed logins for this %s",
                user if len(user) <= 64 else user[:64] + "...",
                address or "?",
                throttled.by,
            )
            return False, throttled.delay
        verdict: list[bool] = []  # the check's answer, once it ran (in a worker thread)
        if self.book.remembered(user, password):
            verdict.append(True)
        else:
            try:
                async with self._lane(address):
                    await trio.to_thread.run_sync(
                        lambda: verdict.append(self.book.check(user, password)), limiter=self.limiter
                    )
            finally:
                if not verdict:
                    # cancelled before the check ran (the handshake time ran out while it waited for a hash
                    # thread, or the socket was evicted): no password was tried, so the allowance admit took is
                    # given back; only wrong passwords count as failures
                    self.throttle.succeeded(address, user, trio.current_time())
        ok = verdict[0]
        if ok:
            self.throttle.succeeded(address, user, trio.current_time())
            return True, 0.0
        return False, self.failure_delay

    @asynccontextmanager
    async def _lane(self, address: str | None) -> AsyncIterator[None]:
        """Hold the lane of ``address`` (one check per peer address queued for a thread at a time, the others
        wait in their address's lane, in order). So the threads serve addresses in turn: a login waits behind
        at most one check per other address, not behind every guess one address sends on many connections.
        A lane is forgotten when nobody holds or waits for it (memory bounded by the connections). A peer
        without an address (not a socket) has no lane."""
        if address is None:
            yield
            return
        lane = self._lanes.get(address)
        if lane is None:
            lane = self._lanes[address] = _Lane()
        lane.users += 1
        try:
            async with lane.lock:
                yield
        finally:
            lane.users -= 1
            if not lane.users:
                del self._lanes[address]


class _Lane:
    """One peer address's turn at the hash threads: a FIFO lock, and how many checks hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.users = 0
