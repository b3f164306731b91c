"""An in-memory broker for trio tests: no sockets, no real waiting (in the spirit of hypercorn's tests).

``memory_broker(settings)`` runs a ``Broker``, its transaction timer (``run_broker_timer``) and one
``ConnectionTask`` per ``connect()``, each over ``trio.testing.memory_stream_pair()``. The test holds the
other end as a ``MemoryPeer``: a sans-IO AMQP client that sends exactly the frames it is told to (built
with ``minibroker.testing.frames``) and parses what the broker answers. Typical use::

    async with memory_broker(BrokerSettings(transaction_timeout=10)) as mb:
        peer = await mb.connect()
        await peer.open()
        await peer.begin()
        await peer.attach_sender("orders", handle=0)
        await peer.expect(Flow)
        await peer.transfer(0, 0, frames.message("hi"))
        assert isinstance((await peer.expect(Disposition)).state, Accepted)
        assert mb.queue("orders").depth == 1

Run it under ``trio.testing.MockClock(autojump_threshold=0)`` (pytest-trio's ``autojump_clock``) and every
wait, transaction time-out included, passes in virtual time. Each receive is bounded by
``trio.fail_after(peer.timeout)`` and fails with an ``AssertionError`` listing the last frames seen.
It is ``ScriptedPeer`` over a trio stream: the same client core (``minibroker.testing.client``) keeps the
protocol's bookkeeping and runs the composite steps; handles and delivery ids are the test's to choose.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import trio
import trio.testing

from minibroker.amqp.definitions import Attach, Begin, Close, Open
from minibroker.amqp.framing import AMQP_FRAME
from minibroker.broker.clock import WallClock
from minibroker.broker.core import OFFERED_CAPABILITIES, Broker, BrokerSettings
from minibroker.engine.connection import ServerConnection
from minibroker.handles import NamespaceView
from minibroker.server.clock import BrokerTime
from minibroker.server.connection import ConnectionTask, run_broker_timer, wake_writers
from minibroker.server.journal import JournalWriter
from minibroker.store.journal import Journal
from minibroker.testing import client, frames
from minibroker.testing.client import ClientConnection, Ended, Expect, Frame, ProtocolHeader, Script, ScriptRun

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")
_RECEIVE_SIZE = 65536


class MemoryPeer:
    """The client end of one in-memory connection (any trio stream, in fact), driven frame by frame."""

    def __init__(self, stream: trio.abc.Stream, timeout: float = 5.0) -> None:
        self.stream = stream
        self.timeout = timeout
        self.conn = ClientConnection()
        """The protocol state: sessions, links, what each side counted."""
        self.received: list[Frame] = []
        """Every frame received so far, heartbeats included (for assertion messages)."""

    @property
    def remote_open(self) -> Open | None:
        """The broker's ``open``, once it came."""
        return self.conn.remote_open

    # -- bytes --------------------------------------------------------------------------------------
    async def send_raw(self, data: bytes) -> None:
        """Send bytes exactly as given."""
        self.conn.send_raw(data)
        await self._flush()

    async def _flush(self) -> None:
        await self.stream.send_all(self.conn.data_to_send())

    def _next_nowait(self) -> ProtocolHeader | Frame | Ended | None:
        event = self.conn.next_event()
        if isinstance(event, Frame):
            self.received.append(event)
        return event

    async def _next(self, waiting_for: str) -> ProtocolHeader | Frame | Ended:
        """The next header, frame or end of the stream (waits at most ``timeout`` for each read)."""
        while (event := self._next_nowait()) is None:
            try:
                with trio.fail_after(self.timeout):
                    data = await self.stream.receive_some(_RECEIVE_SIZE)
            except trio.TooSlowError:
                seen = client.recent(self.received)
                raise AssertionError(f"timed out after {self.timeout}s waiting for {waiting_for}{seen}") from None
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            self.conn.receive_data(bytes(data))
        return event

    async def aclose(self) -> None:
        """Drop the connection without any AMQP closing handshake."""
        await self.stream.aclose()

    # -- frames -------------------------------------------------------------------------------------
    async def send(
        self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME
    ) -> None:
        """Send one frame."""
        self.conn.send(performative, channel, payload, frame_type)
        await self._flush()

    async def receive(self) -> Frame:
        """The next frame that is not a heartbeat (waits at most ``timeout`` for each read)."""
        while True:
            event = await self._next("a frame")
            if not isinstance(event, Frame):
                seen = client.recent(self.received)
                raise AssertionError(f"connection closed by the broker while waiting for a frame{seen}")
            if not event.is_heartbeat:
                return event

    async def expect_frame(self, kind: type[P], channel: int | None = None) -> Frame:
        """The next frame, which must carry a ``kind`` on ``channel`` (any channel when None)."""
        item = await self.receive()
        client.check(Expect(kind, channel), item, self.received)
        return item

    async def expect(self, kind: type[P], channel: int | None = None) -> P:
        """The next frame's performative, which must be a ``kind``."""
        performative: P = (await self.expect_frame(kind, channel)).performative
        return performative

    async def expect_nothing(self, seconds: float = 1.0) -> None:
        """No frame (heartbeats aside) arrives within ``seconds`` (virtual seconds under a MockClock)."""
        with trio.move_on_after(seconds):
            item = await self.receive()
            raise AssertionError(f"expected no frame, got {item!r}")

    async def expect_closed(self) -> None:
        """The broker ends the stream; only heartbeats may come before."""
        while True:
            event = await self._next("the connection to close")
            if isinstance(event, Ended):
                return
            if isinstance(event, ProtocolHeader) or not event.is_heartbeat:
                raise AssertionError(f"expected the connection to close, got {event!r}")

    async def run(self, script: Script[R]) -> R:
        """Run a client-core script (``minibroker.testing.client``): its sends and expectations, in order."""
        steps = ScriptRun(self.conn, script)
        step = steps.advance()
        while True:
            await self._flush()
            if step is None:
                return cast(R, steps.result)
            if step.header is not None:
                self.conn.expect_header()
            answer = await (self._next("a protocol header") if step.header is not None else self.receive())
            if isinstance(answer, Ended):
                raise AssertionError("connection closed by the broker while waiting for a protocol header")
            client.check(step, answer, self.received)
            step = steps.advance(answer)

    # -- connection, sessions, links (as ``ScriptedPeer``) --------------------------------------------
    async def open(self, **fields: Any) -> Open:
        """AMQP header exchange (no SASL), our ``open`` with ``fields``; return the broker's open."""
        return await self.run(client.open_connection(frames.open_(**fields)))

    async def close(self, error: Any = None) -> Close:
        """Send ``close``; expect the broker's close (after what it sent before it saw ours) and the end."""
        reply = await self.run(client.close_connection(Close(error=error)))
        await self.expect_closed()
        return reply

    async def begin(self, channel: int = 0, **fields: Any) -> Begin:
        """Send ``begin`` on ``channel``; return the broker's answering begin."""
        return await self.run(client.begin_session(frames.begin(**fields), channel))

    async def attach_sender(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we send to ``address``; return the broker's attach (a flow follows)."""
        return await self.run(client.attach_link(frames.attach_sender(address, handle, name, **fields), channel))

    async def attach_receiver(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we receive from ``address``; return the broker's attach."""
        return await self.run(client.attach_link(frames.attach_receiver(address, handle, name, **fields), channel))

    async def flow(
        self, handle: int | None = None, link_credit: int | None = None, *, channel: int = 0, **fields: Any
    ) -> None:
        """Send ``flow``; session ids are filled in from what this peer sent and received (``delivery_count``
        null unless given)."""
        fields.setdefault("delivery_count", None)
        await self.send(self.conn.flow(handle, link_credit, channel=channel, **fields), channel=channel)

    async def transfer(
        self, handle: int, delivery_id: int | None, payload: bytes = b"", *, channel: int = 0, **fields: Any
    ) -> None:
        """Send one ``transfer`` frame (``more=True`` and ``delivery_id=None`` for multi-frame ones); ``fields``
        as ``frames.transfer`` takes them (``settled``, ``state``, ``tag`` ...)."""
        await self.send(frames.transfer(handle, delivery_id, **fields), channel, payload)

    async def disposition(self, first: int, last: int | None = None, *, channel: int = 0, **fields: Any) -> None:
        """Send ``disposition`` for deliveries ``first``..``last``; by default as their receiver, settling them
        (``fields`` as ``frames.disposition`` takes them: ``role``, ``settled``, ``state``)."""
        await self.send(frames.disposition(first, last, **fields), channel)


class MemoryBroker(NamespaceView):
    """A broker running in the test's trio loop; ``connect()`` gives a new client end.

    It is inspected as the embedded broker is (``minibroker.handles``): ``mb.queue("orders").depth``,
    ``mb.transactions``, ``mb.connections``, all read in the test's own loop.
    """

    def __init__(
        self,
        broker: Broker,
        nursery: trio.Nursery,
        make_engine: Callable[[int], ServerConnection],
        timeout: float,
        writer: JournalWriter | None = None,
        clock: BrokerTime | None = None,
    ) -> None:
        self.broker = broker
        self.clock = clock if clock is not None else BrokerTime(broker)
        """The broker's clock: ``mode``, ``now`` and, when virtual, ``advance(seconds)`` (``RunningBroker.clock``)."""
        self.writer = writer
        """With a ``data_dir``: the journal writer (``writer.journal.ops`` is the file I/O a test may fail)."""
        self.tasks: list[ConnectionTask] = []
        self._nursery = nursery
        self._make_engine = make_engine
        self._timeout = timeout
        self._ids = itertools.count(1)

    async def connect(self) -> MemoryPeer:
        """A new connection: its ``ConnectionTask`` starts serving at once."""
        client, server = trio.testing.memory_stream_pair()
        conn_id = next(self._ids)
        task = ConnectionTask(conn_id, server, self.broker, self._make_engine(conn_id), clock=self.clock)
        self.tasks.append(task)
        self._nursery.start_soon(task.run)
        return MemoryPeer(client, self._timeout)

    def _call(self, fn: Callable[[Broker], T]) -> T:
        self.broker.clock.move_to(self.clock.time())
        result = fn(self.broker)
        wake_writers(self.broker)  # what a call gave connections to do (a fault dropping one) goes out
        return result

    def _now(self) -> float:
        return self.clock.time()

    @staticmethod
    async def settle() -> None:
        """Let every task run until all are blocked (the broker has handled what was sent)."""
        await trio.testing.wait_all_tasks_blocked()


def _default_engine(conn_id: int) -> ServerConnection:
    return ServerConnection(offered_capabilities=list(OFFERED_CAPABILITIES))


@asynccontextmanager
async def memory_broker(
    settings: BrokerSettings | None = None,
    *,
    txn_ids: Iterator[bytes] | None = None,
    make_engine: Callable[[int], ServerConnection] = _default_engine,
    receive_timeout: float = 5.0,
    clock: WallClock | None = None,
    data_dir: str | Path | None = None,
    data_recover: str = "strict",
    data_sync: bool = True,
    clock_mode: str = "real",
) -> AsyncIterator[MemoryBroker]:
    """Run a broker, its timer and its connections in a nursery for the duration of the block.

    ``receive_timeout`` bounds each receive of every ``MemoryPeer``; ``clock`` maps wall-clock message fields
    onto trio's clock. ``clock_mode="virtual"``: the broker's timers run on virtual time, moved only by
    ``mb.clock.advance(seconds)`` (``minibroker.server.clock``). With ``data_dir`` the broker journals there
    (recovering what is there first), as ``serve`` does (``data_sync=False``: no fsync, so no thread: what a
    ``MockClock`` test wants). Leaving the block cancels everything; connections get no closing handshake (close
    them in the test if that matters).
    """
    journal = writer = None
    if data_dir is not None:
        journal = Journal(data_dir, sync=data_sync, recover=data_recover)
        state = journal.recover()
    broker = Broker(settings, txn_ids=txn_ids, clock=clock, durable=journal is not None)
    try:
        broker_time = BrokerTime(broker, clock_mode)
        if journal is not None:
            broker.restore(state, broker_time.time())
            writer = JournalWriter(journal, broker, broker_time.time)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_broker_timer, broker, broker_time)
            if writer is not None:
                nursery.start_soon(writer.run)
            yield MemoryBroker(broker, nursery, make_engine, receive_timeout, writer, broker_time)
            nursery.cancel_scope.cancel()
    finally:
        if writer is not None:
            writer.close()
        elif journal is not None:
            journal.close()


__all__ = ["MemoryBroker", "MemoryPeer", "memory_broker"]
