"""Run a broker in a background thread, for synchronous code (tests using BlockingConnection).

The broker runs its own trio loop in a daemon thread. ``run_in_thread`` returns only when the listener
is bound, and ``ThreadedBroker.call(fn)`` runs ``fn(running_broker)`` inside the broker's loop and waits
for its answer, so test code never touches broker state from the wrong thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import trio

from minibroker.server.app import ConfigLike, RunningBroker, as_config, serve

T = TypeVar("T")


class ThreadedBroker:
    """A broker served from a background thread."""

    def __init__(self, running: RunningBroker, token: trio.lowlevel.TrioToken) -> None:
        self.running = running
        self._token = token

    @property
    def url(self) -> str:
        """``amqp://127.0.0.1:PORT``."""
        return self.running.url

    @property
    def port(self) -> int:
        return self.running.port

    def call(self, fn: Callable[[RunningBroker], T]) -> T:
        """Run ``fn(running_broker)`` in the broker's thread and return its result."""
        return trio.from_thread.run_sync(fn, self.running, trio_token=self._token)


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
                box["broker"] = ThreadedBroker(running, trio.lowlevel.current_trio_token())
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
            trio.from_thread.run_sync(stop.set, trio_token=broker._token)
        thread.join(start_timeout)
