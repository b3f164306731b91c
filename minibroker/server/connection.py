"""The trio task that pumps bytes between one socket and its engine.

Two loops share the connection: the reader feeds received bytes (and timeouts) to the engine and the
events to the broker core; the writer sleeps until someone marks the engine as having output, then
sends everything queued in one ``send_all``. Awaiting the write is the back-pressure: while a peer does
not read, its writer blocks and the engine's buffer grows only by what that peer's credit allows.
"""

from __future__ import annotations

import logging

import trio

from minibroker.broker.core import Broker
from minibroker.broker.namespace import Namespace
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import AuthenticationFailed, Event

log = logging.getLogger("minibroker.connection")
_RECEIVE_SIZE = 65536


def wake_writers(broker: Broker) -> None:
    """Write what the broker journaled, and wake the writer of every connection it gave output to."""
    sink = broker.journal_sink
    if sink is not None:
        sink.write()
    for engine in broker.take_dirty():
        task = engine.context
        if task is not None:
            task.wake()


async def run_broker_timer(broker: Broker) -> None:
    """Call ``broker.handle_timeout`` at its deadlines (transaction time-outs), for ever."""
    armed = trio.Event()

    def rearm() -> None:
        armed.set()

    broker.on_new_deadline = rearm
    while True:
        deadline = broker.next_deadline()
        if deadline is None:
            await armed.wait()
            armed = trio.Event()
            continue
        await trio.sleep_until(deadline)
        broker.handle_timeout(trio.current_time())
        wake_writers(broker)


class ConnectionTask:
    """One accepted connection."""

    def __init__(
        self,
        conn_id: int,
        stream: trio.abc.Stream,
        broker: Broker,
        engine: ServerConnection,
        namespace: Namespace | None = None,
        failure_delay: float = 0.0,
    ) -> None:
        self.id = conn_id
        self.namespace = namespace
        self.failure_delay = failure_delay
        self.stream = stream
        self.broker = broker
        self.engine = engine
        engine.context = self
        self._wakeup = trio.Event()

    def wake(self) -> None:
        """The engine has bytes to send."""
        self._wakeup.set()

    async def run(self) -> None:
        broker = self.broker
        broker.connection_made(self.engine, self.namespace)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery.cancel_scope)
                await self._reader()
                # the engine is finished: let the writer flush, then stop
                self.wake()
        finally:
            if not self.engine.finished:
                self._feed(b"")
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    def _feed(self, data: bytes | bytearray) -> None:
        events = self.engine.receive_data(data, trio.current_time())
        self._publish(events)

    def _publish(self, events: list[Event]) -> None:
        broker = self.broker
        if events:
            broker.handle(self.engine, events, trio.current_time())
        if self.engine.has_output:
            broker.dirty.add(self.engine)
        wake_writers(broker)

    async def _reader(self) -> None:
        engine = self.engine
        while not engine.finished:
            deadline = engine.next_deadline()
            data = None
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                try:
                    data = await self.stream.receive_some(_RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
            if data is None:
                self._publish(engine.handle_timeout(trio.current_time()))
                continue
            events = engine.receive_data(data, trio.current_time())
            if self.failure_delay and any(isinstance(e, AuthenticationFailed) for e in events):
                # a failed login is answered late, so guessing passwords is slow
                await trio.sleep(self.failure_delay)
            self._publish(events)

    async def _writer(self, cancel_scope: trio.CancelScope) -> None:
        engine = self.engine
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            data = engine.data_to_send()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    cancel_scope.cancel()
                    return
                if engine.throttled:
                    # the peer read what was queued: deliveries held back for it may go on
                    self.broker.resume(engine)
                    wake_writers(self.broker)
            if engine.finished and not engine.has_output:
                cancel_scope.cancel()
                return
