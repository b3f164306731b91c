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
Bookkeeping mirrors ``ScriptedPeer``: transfer counts per channel for ``flow``, the broker's channel for
each ``begin``; handles and delivery ids are the test's to choose.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

from minibroker.amqp.definitions import Attach, Begin, Close, Open, Transfer
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER
from minibroker.broker.clock import WallClock
from minibroker.broker.core import OFFERED_CAPABILITIES, Broker, BrokerSettings
from minibroker.engine.connection import ServerConnection
from minibroker.handles import NamespaceView
from minibroker.server.connection import ConnectionTask, run_broker_timer
from minibroker.server.journal import JournalWriter
from minibroker.store.journal import Journal
from minibroker.testing import frames
from minibroker.testing.frames import Frame, FrameBuffer

P = TypeVar("P")
T = TypeVar("T")
_RECEIVE_SIZE = 65536


class MemoryPeer:
    """The client end of one in-memory connection, driven frame by frame."""

    def __init__(self, stream: trio.abc.Stream, timeout: float = 5.0) -> None:
        self.stream = stream
        self.timeout = timeout
        self.received: list[Frame] = []
        """Every frame received so far, heartbeats included (for assertion messages)."""
        self.remote_open: Open | None = None
        self.remote_channels: dict[int, int] = {}
        """Our channel -> the broker's channel, from its answering ``begin``."""
        self._buffer = FrameBuffer()
        self._eof = False
        self._transfers_out: dict[int, int] = {}
        self._transfers_in: dict[int, int] = {}  # by the broker's channel

    # -- bytes --------------------------------------------------------------------------------------
    async def send_raw(self, data: bytes) -> None:
        """Send bytes exactly as given."""
        await self.stream.send_all(data)

    async def _fill(self, waiting_for: str) -> None:
        if self._eof:
            raise AssertionError(f"connection closed by the broker while waiting for {waiting_for}{self._seen()}")
        try:
            with trio.fail_after(self.timeout):
                data = await self.stream.receive_some(_RECEIVE_SIZE)
        except trio.TooSlowError:
            raise AssertionError(f"timed out after {self.timeout}s waiting for {waiting_for}{self._seen()}") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self._eof = True
            raise AssertionError(f"connection closed by the broker while waiting for {waiting_for}{self._seen()}")
        self._buffer.feed(bytes(data))

    def _seen(self) -> str:
        recent = [f for f in self.received if not f.is_heartbeat][-5:]
        return "; last frames received: " + ", ".join(map(repr, recent)) if recent else "; no frame received"

    async def aclose(self) -> None:
        """Drop the connection without any AMQP closing handshake."""
        await self.stream.aclose()

    # -- frames -------------------------------------------------------------------------------------
    async def send(
        self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME
    ) -> None:
        """Send one frame."""
        if isinstance(performative, Transfer):
            self._transfers_out[channel] = self._transfers_out.get(channel, 0) + 1
        await self.send_raw(frames.frame(channel, performative, payload, frame_type))

    def receive_nowait(self) -> Frame | None:
        """The next non-heartbeat frame already received, or None."""
        while (item := self._buffer.next_frame()) is not None:
            self.received.append(item)
            if item.is_heartbeat:
                continue
            if isinstance(item.performative, Transfer):
                self._transfers_in[item.channel] = self._transfers_in.get(item.channel, 0) + 1
            return item
        return None

    async def receive(self) -> Frame:
        """The next frame that is not a heartbeat (waits at most ``timeout`` for each read)."""
        while (item := self.receive_nowait()) is None:
            await self._fill("a frame")
        return item

    async def expect_frame(self, kind: type[P], channel: int | None = None) -> Frame:
        """The next frame, which must carry a ``kind`` on ``channel`` (any channel when None)."""
        item = await self.receive()
        if not isinstance(item.performative, kind) or (channel is not None and item.channel != channel):
            where = "" if channel is None else f" on channel {channel}"
            raise AssertionError(f"expected {kind.__name__}{where}, got {item!r}{self._seen()}")
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
            item = self.receive_nowait()
            if item is not None:
                raise AssertionError(f"expected the connection to close, got {item!r}")
            try:
                await self._fill("the connection to close")
            except AssertionError:
                if not self._eof:
                    raise
                return

    # -- connection, sessions, links (as ``ScriptedPeer``) --------------------------------------------
    async def open(self, **fields: Any) -> Open:
        """AMQP header exchange (no SASL), our ``open`` with ``fields``; return the broker's open."""
        await self.send_raw(AMQP_HEADER)
        while (header := self._buffer.next_header()) is None:
            await self._fill("a protocol header")
        if header != AMQP_HEADER:
            raise AssertionError(f"expected the AMQP header, got {header!r}")
        await self.send(frames.open_(**fields))
        self.remote_open = await self.expect(Open, channel=0)
        return self.remote_open

    async def close(self, error: Any = None) -> Close:
        """Send ``close``; expect the broker's close and the end of the stream."""
        await self.send(Close(error=error))
        while not isinstance((item := await self.receive()).performative, Close):
            pass  # frames the broker sent before it saw our close
        await self.expect_closed()
        reply: Close = item.performative
        return reply

    async def begin(self, channel: int = 0, **fields: Any) -> Begin:
        """Send ``begin`` on ``channel``; return the broker's answering begin."""
        await self.send(frames.begin(**fields), channel=channel)
        item = await self.expect_frame(Begin)
        reply: Begin = item.performative
        if reply.remote_channel != channel:
            raise AssertionError(f"begin answered for channel {reply.remote_channel}, not {channel}")
        self.remote_channels[channel] = item.channel
        return reply

    async def attach_sender(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we send to ``address``; return the broker's attach (a flow follows)."""
        await self.send(frames.attach_sender(address, handle, name, **fields), channel=channel)
        return await self.expect(Attach)

    async def attach_receiver(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we receive from ``address``; return the broker's attach."""
        await self.send(frames.attach_receiver(address, handle, name, **fields), channel=channel)
        return await self.expect(Attach)

    async def flow(
        self, handle: int | None = None, link_credit: int | None = None, *, channel: int = 0, **fields: Any
    ) -> None:
        """Send ``flow``; session ids are filled in from what this peer sent and received."""
        remote = self.remote_channels.get(channel, channel)
        fields.setdefault("next_incoming_id", self._transfers_in.get(remote, 0))
        fields.setdefault("next_outgoing_id", self._transfers_out.get(channel, 0))
        await self.send(frames.flow(handle=handle, link_credit=link_credit, **fields), channel=channel)

    async def transfer(
        self,
        handle: int,
        delivery_id: int | None,
        payload: bytes = b"",
        *,
        settled: bool | None = None,
        state: Any = None,
        channel: int = 0,
        **fields: Any,
    ) -> None:
        """Send one ``transfer`` frame (``more=True`` and ``delivery_id=None`` for multi-frame ones)."""
        await self.send(frames.transfer(handle, delivery_id, settled=settled, state=state, **fields), channel, payload)

    async def disposition(
        self,
        first: int,
        last: int | None = None,
        *,
        role: bool = frames.RECEIVER,
        settled: bool = True,
        state: Any = None,
        channel: int = 0,
    ) -> None:
        """Send ``disposition`` for deliveries ``first``..``last`` (by default as their receiver)."""
        await self.send(frames.disposition(first, last, role=role, settled=settled, state=state), channel)


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
    ) -> None:
        self.broker = broker
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
        task = ConnectionTask(conn_id, server, self.broker, self._make_engine(conn_id))
        self.tasks.append(task)
        self._nursery.start_soon(task.run)
        return MemoryPeer(client, self._timeout)

    def _call(self, fn: Callable[[Broker], T]) -> T:
        return fn(self.broker)

    def _now(self) -> float:
        return trio.current_time()

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
) -> AsyncIterator[MemoryBroker]:
    """Run a broker, its timer and its connections in a nursery for the duration of the block.

    ``receive_timeout`` bounds each receive of every ``MemoryPeer``; ``clock`` maps wall-clock message fields
    onto trio's clock. With ``data_dir`` the broker journals there (recovering what is there first), as
    ``serve`` does (``data_sync=False``: no fsync, so no thread: what a ``MockClock`` test wants). Leaving the
    block cancels everything; connections get no closing handshake (close them in the test if that matters).
    """
    journal = writer = None
    if data_dir is not None:
        journal = Journal(data_dir, sync=data_sync, recover=data_recover)
        state = journal.recover()
    broker = Broker(settings, txn_ids=txn_ids, clock=clock, durable=journal is not None)
    try:
        if journal is not None:
            broker.restore(state, trio.current_time())
            writer = JournalWriter(journal, broker)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_broker_timer, broker)
            if writer is not None:
                nursery.start_soon(writer.run)
            yield MemoryBroker(broker, nursery, make_engine, receive_timeout, writer)
            nursery.cancel_scope.cancel()
    finally:
        if writer is not None:
            writer.close()
        elif journal is not None:
            journal.close()


__all__ = ["MemoryBroker", "MemoryPeer", "memory_broker"]
