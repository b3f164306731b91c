"""How often ``PlainSocket`` reads and waits, and that a connection task's turns stay fair.

A read that did not fill the buffer drained the socket, so the next ``receive`` waits at once: one ``recv_into``
per request, not a ``recv_into`` told ``EAGAIN`` before the wait (``minibroker.server.plainsocket``'s docstring);
a read that filled the buffer reads again after a checkpoint, without waiting. Then two connection tasks on one
broker: a peer that always has data (empty frames, AMQP 1.0 section 2.4.5, in 64 KiB writes, for ever) and a
bystander doing request/answer round trips; both must progress.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from minibroker.amqp.definitions import Accepted, Disposition, Flow
from minibroker.server.plainsocket import PlainSocket
from minibroker.testing import frames
from minibroker.testing.memory import MemoryPeer, memory_broker
from tests.server.test_plainsocket import Pair, served

_EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # size 8, doff 2, AMQP, channel 0: a heartbeat


@pytest.fixture
async def pairs() -> AsyncIterator[list[Pair]]:
    """Two pairs of connected stream sockets (Unix socket pairs: what one end sends is queued at the other's at
    once), as trio streams; closed after the test."""
    made = [(trio.SocketStream(a), trio.SocketStream(b)) for a, b in (trio.socket.socketpair() for _ in range(2))]
    yield made
    for ours, theirs in made:
        await trio.aclose_forcefully(ours)
        await trio.aclose_forcefully(theirs)


class CountingSocket:
    """A socket whose ``recv_into`` calls are noted in ``steps`` ("read N": N octets)."""

    def __init__(self, sock: socket.socket, steps: list[str]) -> None:
        self.sock = sock
        self.steps = steps

    def recv_into(self, buffer: bytearray) -> int:
        size = self.sock.recv_into(buffer)
        self.steps.append(f"read {size}")
        return size

    def detach(self) -> int:
        return self.sock.detach()


def noted(plain: PlainSocket, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The steps ``plain`` takes: its reads, and its waits ("wait")."""
    steps: list[str] = []
    plain._sock = CountingSocket(plain._sock, steps)  # type: ignore[assignment]
    wait_readable = trio.lowlevel.wait_readable

    async def spy(fd: int) -> None:
        steps.append("wait")
        await wait_readable(fd)

    monkeypatch.setattr(trio.lowlevel, "wait_readable", spy)
    return steps


async def test_a_read_that_drained_the_socket_waits_before_the_next(
    pairs: list[Pair], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = pairs[0]
    plain = PlainSocket(ours.socket)
    steps = noted(plain, monkeypatch)
    with trio.fail_after(5):
        for i in range(5):
            await theirs.send_all(b"request %d" % i)
            assert await plain.receive(None) == b"request %d" % i
    assert steps == ["wait", "read 9"] * 5  # one system call a request: none told EAGAIN
    plain.detach()


async def test_a_read_that_filled_the_buffer_reads_again_without_waiting(
    pairs: list[Pair], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = pairs[0]
    plain = PlainSocket(ours.socket)
    steps = noted(plain, monkeypatch)
    await theirs.send_all(b"x" * 65546)
    with trio.fail_after(5):
        assert len(await plain.receive(None) or b"") == 65536
        assert await plain.receive(None) == b"x" * 10  # more was likely there: read after a checkpoint
        await theirs.send_all(b"next")
        assert await plain.receive(None) == b"next"  # the short read drained it: wait first
    assert steps == ["wait", "read 65536", "read 10", "wait", "read 4"]
    plain.detach()


async def test_a_busy_peer_and_a_bystander_both_progress(pairs: list[Pair]) -> None:
    (busy_ours, busy_theirs), (calm_ours, calm_theirs) = pairs
    async with memory_broker() as mb, served(mb, busy_ours) as busy_task, served(mb, calm_ours) as calm_task:
        assert busy_task.reads_socket
        assert calm_task.reads_socket
        busy = MemoryPeer(busy_theirs)
        await busy.open()
        await busy.begin()
        calm = MemoryPeer(calm_theirs)
        await calm.open()
        await calm.begin()
        await calm.attach_sender("calm", handle=0)
        await calm.expect(Flow)
        written = 0
        megabytes = [trio.Event() for _ in range(64)]  # each set once the busy peer has written that many MiB

        async def flood() -> None:
            nonlocal written
            chunk = _EMPTY_FRAME * 8192  # 64 KiB of empty frames: the broker's reads always find data
            while True:
                await busy.stream.send_all(chunk)
                written += len(chunk)
                megabytes[min(written >> 20, 63)].set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            with trio.fail_after(30):
                await megabytes[1].wait()  # the busy peer is being read
                before = written
                for i in range(20):
                    await calm.transfer(0, i, frames.message("hi"))
                    assert isinstance((await calm.expect(Disposition)).state, Accepted)
                assert written > before  # the busy peer went on while the bystander was served
                await megabytes[min((before >> 20) + 1, 63)].wait()  # and it still is
            nursery.cancel_scope.cancel()
        assert mb.queue("calm").depth == 20
