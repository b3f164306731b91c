"""How often ``PlainSocket`` reads and waits, and that a connection task's turns stay fair.

A read that finds nothing waits, and the wait is the other tasks' turn: no checkpoint before it, as there was; of
two reads in a row that find data at once, the second gives the others a turn before it returns, and what it read
is kept for the next call if it is cancelled there (``minibroker.server.plainsocket``'s docstring). Then two
connection tasks on one broker: a peer that always has data (empty frames, AMQP 1.0 section 2.4.5, in 64 KiB
writes, for ever) and a bystander doing request/answer round trips; both must progress.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from minibroker.amqp.definitions import Accepted, Disposition, Flow
from minibroker.server import plainsocket
from minibroker.server.plainsocket import PlainSocket
from minibroker.testing import frames
from minibroker.testing.memory import MemoryPeer, memory_broker
from tests.server.test_plainsocket import Pair, served

_EMPTY_FRAME = b"\x00\x00\x00\x08\x02\x00\x00\x00"  # size 8, doff 2, AMQP, channel 0: a heartbeat


@pytest.fixture
async def pair_of_sockets(pairs: list[Pair]) -> Pair:
    """One of ``pairs``."""
    return pairs[0]


@pytest.fixture
async def pairs() -> AsyncIterator[list[Pair]]:
    """Two pairs of connected stream sockets (Unix socket pairs: what one end sends is queued at the other's at
    once), as trio streams; closed after the test."""
    made = [(trio.SocketStream(a), trio.SocketStream(b)) for a, b in (trio.socket.socketpair() for _ in range(2))]
    yield made
    for ours, theirs in made:
        await trio.aclose_forcefully(ours)
        await trio.aclose_forcefully(theirs)


class NotingSocket:
    """A socket whose ``recv_into`` calls are noted in ``steps`` ("read N": N octets; "read EAGAIN")."""

    def __init__(self, sock: socket.socket, steps: list[str]) -> None:
        self.sock = sock
        self.steps = steps

    def recv_into(self, buffer: bytearray) -> int:
        try:
            size = self.sock.recv_into(buffer)
        except BlockingIOError:
            self.steps.append("read EAGAIN")
            raise
        self.steps.append(f"read {size}")
        return size

    def detach(self) -> int:
        return self.sock.detach()


def noted(plain: PlainSocket, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The steps ``plain`` takes: its reads, its waits for the socket ("wait") and the turns it gives the other tasks
    otherwise ("turn")."""
    steps: list[str] = []
    plain._sock = NotingSocket(plain._sock, steps)  # type: ignore[assignment]

    def noting(step: str, call: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        async def noted_call(*args: int) -> None:
            steps.append(step)
            await call(*args)

        return noted_call

    lowlevel = SimpleNamespace(
        checkpoint_if_cancelled=trio.lowlevel.checkpoint_if_cancelled,
        wait_readable=noting("wait", trio.lowlevel.wait_readable),
        checkpoint=noting("turn", trio.lowlevel.checkpoint),
        cancel_shielded_checkpoint=noting("turn", trio.lowlevel.cancel_shielded_checkpoint),
    )

    class NotedTrio:  # trio as plainsocket sees it: its waits and turns noted
        def __getattr__(self, name: str) -> object:
            return lowlevel if name == "lowlevel" else getattr(trio, name)

    monkeypatch.setattr(plainsocket, "trio", NotedTrio())
    return steps


async def test_a_read_that_finds_nothing_waits_without_a_turn_before_it(
    pair_of_sockets: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request read at once, answered, then the next read finds nothing: it waits, and the wait is the others'
    turn (no checkpoint before the read, as there was: two trips through the scheduler where one does)."""
    ours, theirs = pair_of_sockets
    plain = PlainSocket(ours.socket)
    steps = noted(plain, monkeypatch)
    await theirs.send_all(b"a")
    with trio.fail_after(5):
        assert await plain.receive(None) == b"a"
        async with trio.open_nursery() as nursery:

            async def later() -> None:
                await trio.testing.wait_all_tasks_blocked()
                await theirs.send_all(b"b")

            nursery.start_soon(later)
            assert await plain.receive(None) == b"b"
    assert steps == ["read 1", "read EAGAIN", "wait", "read 1"]
    plain.detach()


async def test_two_reads_in_a_row_that_find_data_give_the_others_a_turn(
    pair_of_sockets: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = pair_of_sockets
    plain = PlainSocket(ours.socket)
    steps = noted(plain, monkeypatch)
    with trio.fail_after(5):
        for octet in b"cdef":
            await theirs.send_all(bytes([octet]))
            assert await plain.receive(None) == bytes([octet])
    # (as before: one read a turn, but the first after a wait; the turn is taken after the read)
    assert steps == ["read 1", "read 1", "turn", "read 1", "turn", "read 1", "turn"]
    plain.detach()


async def test_a_cancelled_receive_loses_nothing(pair_of_sockets: Pair) -> None:
    """Cancelled at the turn it gives after a read (the peer always has data), ``receive`` keeps what it read for
    the next call."""
    ours, theirs = pair_of_sockets
    plain = PlainSocket(ours.socket)
    await theirs.send_all(b"first")
    assert await plain.receive(None) == b"first"  # found at once: the next read that does too takes a turn
    await theirs.send_all(b"kept")
    with trio.CancelScope() as scope:
        scope.cancel()
        await plain.receive(None)
    assert scope.cancelled_caught
    assert await plain.receive(None) == b"kept"
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
