"""Run a broker in a background thread, for synchronous code (tests using BlockingConnection, say).

The broker runs its own trio loop in a daemon thread. ``run_in_thread`` returns only when the listener is
bound and every configured node exists. Every inspection call made from another thread runs inside the
broker's loop and waits for its answer (``trio.from_thread``), so test code never touches broker state
from the wrong thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import trio

from minibroker.broker.core import Broker
from minibroker.broker.namespace import DEFAULT_NAMESPACE
from minibroker.broker.personality import Personality
from minibroker.handles import NamespaceView
from minibroker.server.app import ConfigLike, RunningBroker, as_config, format_url, resolve_personality, serve

T = TypeVar("T")


class _Shared:
    """What every view of one threaded broker shares: the trio token and a change condition."""

    def __init__(self, running: RunningBroker, token: trio.lowlevel.TrioToken) -> None:
        self.running = running
        self.token = token
        self.condition = threading.Condition()
        self.version = 0
        self.waiters = 0
        running._server.change_listeners.append(self.changed)

    def changed(self) -> None:
        """Called in the broker thread after each change: wake threads in ``wait_for``."""
        if self.waiters:
            with self.condition:
                self.version += 1
                self.condition.notify_all()


class ThreadedBroker(NamespaceView):
    """A broker served from a background thread (one namespace of it: the default unless created)."""

    def __init__(self, shared: _Shared, port: int, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._shared = shared
        self.running = shared.running
        self.host = shared.running.host
        self.port = port
        self.namespace_name = namespace

    @property
    def url(self) -> str:
        """``amqp://HOST:PORT`` of the listener of this namespace."""
        return format_url(self.host, self.port)

    @property
    def tls_url(self) -> str | None:
        """``amqps://HOST:PORT`` of the TLS listener (default namespace, TLS enabled), else None."""
        return self.running.tls_url if self.namespace_name == DEFAULT_NAMESPACE else None

    @property
    def http_url(self) -> str | None:
        """``http://HOST:PORT`` of the management API (its paths under ``/api/namespaces/NAME/`` for a namespace
        other than the default), None when it is off."""
        return self.running.http_url

    def _call(self, fn: Callable[[Broker], T]) -> T:
        return self.call(lambda running: running._call(fn))

    def _now(self) -> float:
        return self.call(lambda running: running._now())

    @property
    def clock(self) -> ThreadedClock:
        """The broker's clock, used from this thread: ``mode``, ``now`` and ``advance(seconds)`` run in the broker's
        thread (``RunningBroker.clock``); an advance returns once every timer due on the way has fired."""
        return ThreadedClock(self)

    def call(self, fn: Callable[[RunningBroker], T]) -> T:
        """Run ``fn(running_broker)`` in the broker's thread and return its result."""
        return trio.from_thread.run_sync(fn, self.running, trio_token=self._shared.token)

    def wait_for(
        self,
        predicate: Callable[[], bool] | None = None,
        timeout: float = 5.0,
        *,
        queue: str | None = None,
        depth: int | None = None,
        transactions: int | None = None,
    ) -> None:
        """Block until ``predicate()`` holds, re-checking after every change of broker state.

        Instead of a predicate, the keyword conditions a remote broker checks too (``minibroker.connect``):
        ``wait_for(queue="q", depth=1)``, ``wait_for(transactions=0)``. Raises ``TimeoutError`` after ``timeout``
        seconds.
        """
        if predicate is None:
            predicate = self.condition(queue=queue, depth=depth, transactions=transactions)
        elif (queue, depth, transactions) != (None, None, None):
            raise TypeError("wait_for: a predicate or keyword conditions, not both")
        shared = self._shared
        deadline = time.monotonic() + timeout
        with shared.condition:
            shared.waiters += 1
        try:
            while True:
                with shared.condition:
                    seen = shared.version
                if predicate():
                    return
                with shared.condition:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"condition not met within {timeout} s")
                    if shared.version == seen:
                        shared.condition.wait(remaining)
        finally:
            with shared.condition:
                shared.waiters -= 1

    def frames(self, connection: int | None = None) -> list[dict[str, Any]]:
        """The captured frames of one connection, or of all (``RunningBroker.frames``)."""
        return self.call(lambda running: running.frames(connection))

    def capture(self, connection: int) -> dict[str, Any] | None:
        """One connection's capture as the HTTP API answers it (``RunningBroker.capture``)."""
        return self.call(lambda running: running.capture(connection))

    def pcap(self) -> bytes:
        """Every kept capture as a pcap file (``RunningBroker.pcap``)."""
        return self.call(lambda running: running.pcap())

    def write_pcap(self, path: str | Path) -> None:
        """Write ``pcap()`` to ``path`` (from this thread)."""
        Path(path).write_bytes(self.pcap())

    def create_namespace(self, name: str | None = None, personality: str | Personality | None = None) -> ThreadedBroker:
        """A new isolated namespace with a listener of its own; its ``url`` connects into it.

        ``personality`` (a name that ``minibroker personalities`` lists, or a ``Personality``) is whose behaviour
        its connections meet; by default the broker's. ``ValueError`` for an unknown name.
        """
        chosen = resolve_personality(personality)  # an unknown name fails here, not in the broker's thread

        async def create() -> RunningBroker:
            return await self.running.create_namespace(name, chosen)

        created = trio.from_thread.run(create, trio_token=self._shared.token)
        return ThreadedBroker(self._shared, created.port, created.namespace_name)

    def drop_namespace(self) -> None:
        """Close this namespace's listener and connections and forget its state."""
        name = self.namespace_name

        def drop(running: RunningBroker) -> None:
            RunningBroker(running._server, running.host, self.port, name).drop_namespace()

        self.call(drop)

    def __repr__(self) -> str:
        return f"ThreadedBroker({self.url}, namespace={self.namespace_name!r})"


class ThreadedClock:
    """``RunningBroker.clock`` of a threaded broker: each read and each advance runs in the broker's thread."""

    def __init__(self, broker: ThreadedBroker) -> None:
        self._broker = broker

    @property
    def mode(self) -> str:
        """ "real" or "virtual"."""
        return self._broker.call(lambda running: running.clock.mode)

    @property
    def now(self) -> float:
        """Broker time as wall-clock seconds since the epoch."""
        return self._broker.call(lambda running: running.clock.now)

    def advance(self, seconds: float) -> float:
        """Move virtual time ``seconds`` forward, firing every broker timer due on the way; the new ``now``.
        ``ValueError`` for a negative ``seconds``, ``RuntimeError`` on the real clock."""
        return self._broker.call(lambda running: running.clock.advance(seconds))

    def __repr__(self) -> str:
        return f"ThreadedClock(mode={self.mode!r}, now={self.now:.3f})"


@contextmanager
def run_in_thread(config: ConfigLike = None, *, start_timeout: float = 10.0) -> Iterator[ThreadedBroker]:
    """Serve a broker from a background thread for the duration of the ``with`` block."""
    cfg = as_config(config)
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        try:
            async with serve(cfg) as running:
                stop = trio.Event()
                shared = _Shared(running, trio.lowlevel.current_trio_token())
                box["broker"] = ThreadedBroker(shared, running.port)
                box["stop"] = stop
                ready.set()
                await stop.wait()
        except BaseException as exc:
            box["error"] = exc
            ready.set()
            raise

    def target() -> None:
        with suppress(BaseException):  # reported through box["error"]
            trio.run(main)

    thread = threading.Thread(target=target, name="minibroker", daemon=True)
    thread.start()
    if not ready.wait(start_timeout):
        raise RuntimeError("minibroker did not start in time")
    if "error" in box:
        raise box["error"]
    broker: ThreadedBroker = box["broker"]
    try:
        yield broker
    finally:
        stop: trio.Event = box["stop"]
        with suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(stop.set, trio_token=broker._shared.token)
        thread.join(start_timeout)


__all__ = ["ThreadedBroker", "run_in_thread"]
