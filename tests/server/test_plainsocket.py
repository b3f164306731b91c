"""The connection task's own reads and writes on a plain socket (``minibroker.server.plainsocket``).

``PlainSocket`` alone over a trio socket pair: the octets read to tell the protocol come first, a deadline that
has passed reads nothing, the end of the stream, a full socket, and a peer that always has data neither starving
the other tasks nor escaping cancellation. Then a ``ConnectionTask`` serving a broker over a socket pair (the
broker of ``memory_broker``, the peer ``MemoryPeer`` over the other end): requests that arrive one octet per read,
the protocol header's first octets already read by the sniffer, and a peer that stops reading while its answers
go out directly, which must get every answer, in order, once it reads again.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from minibroker.amqp.definitions import Accepted, Attach, Begin, Disposition, Flow, Open
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.broker.core import OFFERED_CAPABILITIES
from minibroker.engine.connection import ServerConnection
from minibroker.server import plainsocket
from minibroker.server.connection import ConnectionTask
from minibroker.server.plainsocket import PlainSocket
from minibroker.server.sniff import PrefixedStream
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

Pair = tuple[trio.SocketStream, trio.SocketStream]


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    """Two connected stream sockets (a Unix socket pair), as trio streams; closed after the test."""
    a, b = trio.socket.socketpair()
    ours, theirs = trio.SocketStream(a), trio.SocketStream(b)
    yield ours, theirs
    await trio.aclose_forcefully(ours)
    await trio.aclose_forcefully(theirs)


def fill(sock: socket.socket) -> int:
    """Write to ``sock`` until it takes no more (its peer reads nothing); the octets written."""
    sock.setblocking(False)
    written = 0
    while True:
        try:
            written += sock.send(b"x" * 65536)
        except BlockingIOError:
            return written


class PeerStream(trio.abc.Stream):
    """The peer's ``stream``, which leaves out the first ``already_read`` octets it is given (the sniffer has them)
    and, with ``octet_by_octet``, writes one octet at a time, each once every task waits (the broker read it)."""

    def __init__(self, stream: trio.abc.Stream, *, already_read: int = 0, octet_by_octet: bool = False) -> None:
        self.stream = stream
        self.skip = already_read
        self.octet_by_octet = octet_by_octet

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        data, self.skip = bytes(data)[self.skip :], max(0, self.skip - len(data))
        if not self.octet_by_octet:
            await self.stream.send_all(data)
            return
        for octet in data:
            await self.stream.send_all(bytes([octet]))
            await trio.testing.wait_all_tasks_blocked()

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.stream.aclose()


# -- PlainSocket -----------------------------------------------------------------------------------------
async def test_the_sniffed_octets_come_first_then_the_socket(pair: Pair) -> None:
    ours, theirs = pair
    prefixed = PrefixedStream(ours, b"AMQP")
    plain = PlainSocket.of(prefixed)
    assert plain is not None
    assert prefixed.take_prefix() == b""  # taken over by the plain socket
    await theirs.send_all(b"\x00\x01\x00\x00")
    assert await plain.receive(None) == b"AMQP"
    assert await plain.receive(None) == b"\x00\x01\x00\x00"
    plain.detach()


async def test_only_a_plain_socket_stream_is_plain(pair: Pair) -> None:
    _client, server = trio.testing.memory_stream_pair()
    assert PlainSocket.of(server) is None
    tls = trio.SSLStream(pair[0], ssl.create_default_context(), server_side=False)
    prefixed = PrefixedStream(tls, b"AMQP")
    assert PlainSocket.of(tls) is None
    assert PlainSocket.of(prefixed) is None
    assert prefixed.take_prefix() == b"AMQP"  # left where it was
    closed = trio.SocketStream(trio.socket.socket())
    await closed.aclose()
    assert PlainSocket.of(closed) is None  # the stream reports it as the end


async def test_a_deadline_that_has_passed_reads_nothing(pair: Pair) -> None:
    ours, theirs = pair
    plain = PlainSocket(ours.socket)
    await theirs.send_all(b"frame")
    assert await plain.receive(trio.current_time() - 1) is None
    assert await plain.receive(trio.current_time() + 5) == b"frame"  # still there
    plain.detach()


async def test_a_deadline_while_waiting(pair: Pair) -> None:
    ours, _theirs = pair
    plain = PlainSocket(ours.socket)
    with trio.fail_after(5):
        assert await plain.receive(trio.current_time() + 0.05) is None
    plain.detach()


async def test_the_end_of_the_stream_reads_empty(pair: Pair) -> None:
    ours, theirs = pair
    plain = PlainSocket(ours.socket)
    await theirs.aclose()
    with trio.fail_after(5):
        assert await plain.receive(None) == b""
    plain.detach()


async def test_a_full_socket_takes_part_then_nothing(pair: Pair) -> None:
    ours, _theirs = pair
    plain = PlainSocket(ours.socket)
    data = b"y" * (8 << 20)
    taken = plain.send(data)
    assert 0 < taken < len(data)
    assert plain.send(data[taken:]) == 0
    plain.detach()
    os.fstat(ours.socket.fileno())  # detaching left the descriptor open (EBADF otherwise): the stream closes it


async def test_a_gone_peer_fails_the_send(pair: Pair) -> None:
    ours, theirs = pair
    plain = PlainSocket(ours.socket)
    await theirs.aclose()
    with pytest.raises(OSError):  # noqa: PT011 (EPIPE or ECONNRESET, as the OS says)
        plain.send(b"late")
    plain.detach()


async def test_a_peer_that_always_has_data_neither_starves_the_others_nor_escapes_cancellation(pair: Pair) -> None:
    ours, theirs = pair
    plain = PlainSocket(ours.socket)
    with socket.socket(fileno=theirs.socket.fileno()) as raw:
        try:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)  # (a Unix socket buffers on this side)
            written = fill(raw)
            seen: list[str] = []

            async def other() -> None:
                while True:
                    seen.append("other")
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(other)
                with trio.fail_after(5):
                    while written > 0:
                        data = await plain.receive(None)
                        assert data
                        written -= len(data)
                        seen.append("read")
                reads = seen.count("read")
                assert reads > 10
                # a read that found data at once lets the others run before the next (trio may order the two
                # tasks either way within a turn, so two reads may meet, never three)
                assert "read,read,read" not in ",".join(seen)
                assert seen.count("other") >= reads - 2
                fill(raw)
                with trio.CancelScope() as cancelled:
                    cancelled.cancel()
                    for _ in range(3):  # data is always there: only the checkpoint before a read can stop us
                        await plain.receive(None)
                assert cancelled.cancelled_caught
                nursery.cancel_scope.cancel()
        finally:
            raw.detach()
    plain.detach()


# -- a connection task on a plain socket ---------------------------------------------------------------
@asynccontextmanager
async def served(mb: MemoryBroker, stream: trio.abc.Stream) -> AsyncIterator[ConnectionTask]:
    """A ``ConnectionTask`` serving ``stream`` (the broker's end of a socket pair) for the block."""
    engine = ServerConnection(offered_capabilities=list(OFFERED_CAPABILITIES))
    task = ConnectionTask(1, stream, mb.broker, engine, clock=mb.clock)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(task.run)
        await trio.testing.wait_all_tasks_blocked()
        yield task
        nursery.cancel_scope.cancel()


async def test_requests_read_one_octet_at_a_time_are_answered(pair: Pair) -> None:
    ours, theirs = pair
    async with memory_broker() as mb, served(mb, ours) as task:
        assert task.reads_socket
        peer = MemoryPeer(PeerStream(theirs, octet_by_octet=True))
        assert isinstance(await peer.open(), Open)
        assert isinstance(await peer.begin(), Begin)
        assert isinstance(await peer.attach_sender("octets", handle=0), Attach)
        await peer.expect(Flow)
        await peer.transfer(0, 0, frames.message("hi"))
        assert isinstance((await peer.expect(Disposition)).state, Accepted)
        assert mb.queue("octets").depth == 1
        await peer.close()
    assert not task.reads_socket  # let go of the descriptor before the stream closed it


async def test_the_header_octets_read_by_the_sniffer_reach_the_engine_first(pair: Pair) -> None:
    ours, theirs = pair
    async with memory_broker() as mb, served(mb, PrefixedStream(ours, AMQP_HEADER[:6])) as task:
        assert task.reads_socket
        peer = MemoryPeer(PeerStream(theirs, already_read=6))
        assert isinstance(await peer.open(), Open)  # the header exchange first
        assert isinstance(await peer.begin(), Begin)


async def test_a_peer_that_stops_reading_gets_every_direct_answer_in_order(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Echoed flows answered by the reader itself (small answers) while the peer reads nothing: once the socket
    is full, what it did not take goes to the writer, and the peer, reading again, gets every answer in order."""
    partial: list[tuple[int, int]] = []
    send = PlainSocket.send

    def spy(self: PlainSocket, data: bytes | memoryview) -> int:
        taken = send(self, data)
        if taken < len(data):
            partial.append((len(data), taken))
        return taken

    monkeypatch.setattr(plainsocket.PlainSocket, "send", spy)
    ours, theirs = pair
    ours.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    count = 3000
    async with memory_broker() as mb, served(mb, ours) as task:
        peer = MemoryPeer(theirs)
        await peer.open()
        await peer.begin()
        await peer.attach_receiver("silent", handle=0)
        # flows with echo, a few per read: each read's answers are small, so the reader writes them itself
        for start in range(1, count + 1, 20):
            batch = [peer.conn.flow(0, credit, echo=True, delivery_count=0) for credit in range(start, start + 20)]
            for flow in batch:
                peer.conn.send(flow, 0)
            await peer.stream.send_all(peer.conn.data_to_send())
            await trio.testing.wait_all_tasks_blocked()
        assert partial, "the socket never filled"
        assert task.reads_socket
        credits = []
        with trio.fail_after(10):
            while len(credits) < count:
                flow = await peer.expect(Flow)
                credits.append(flow.link_credit)
        assert credits == list(range(1, count + 1))
        await peer.close()
