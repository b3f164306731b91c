"""Reads and writes on the OS socket of a plain TCP connection, without trio's stream machinery per request.

A trio ``SocketStream`` pays on every ``receive_some`` and ``send_all`` a conflict check and a reschedule of the
task after the system call succeeds (``cancel_shielded_checkpoint``), so a request read and its answer written cost
the reader three trips through the scheduler. ``PlainSocket`` reads with ``recv_into`` into one reused buffer and
waits with ``trio.lowlevel.wait_readable`` only when the socket has nothing; it writes with one non-blocking
``send`` and says how much the socket took, so the caller decides who writes the rest (the connection's writer
task, which may block). A request and its answer then cost one trip: the wait for the request.

What it keeps of trio's semantics: a read that finds data at once after a read that did not wait either returns
only after a checkpoint (``trio.lowlevel.checkpoint``), so a peer that always has data cannot starve the other
tasks (one read a turn, as before) nor escape cancellation (what that read took is returned by the next call, not
lost); a deadline that has passed is reported before anything is read, as ``trio.move_on_at`` around
``receive_some`` does. TLS streams are not plain: they keep trio's ``SSLStream``.

The turn is taken after the read, not before it, because a read after an answer usually finds nothing (the peer
has not had the time to send the next request): a checkpoint before the read, then the read told ``EAGAIN``, then
the wait, were two trips through the scheduler where the wait alone is the others' turn. Waiting first, without
trying the read, saves the read told ``EAGAIN`` but costs a whole wait when the next request is there already
(clients often write a transfer and a discharge apart); ``bench.floor`` measured it dearer on the whole
(bench/README.md).

The ``socket.socket`` here wraps the stream's file descriptor without owning it: ``detach`` must be called before
the stream closes it (``ConnectionTask.run`` does), so that this object never closes a descriptor number the OS
has given to another connection since.
"""

from __future__ import annotations

import socket

import trio

from minibroker.server.sniff import PrefixedStream

_RECEIVE_SIZE = 65536


class PlainSocket:
    """The non-blocking OS socket under a plain TCP stream (see the module's docstring)."""

    def __init__(self, sock: trio.socket.SocketType, pending: bytes = b"") -> None:
        self._fd = sock.fileno()
        self._sock = socket.socket(fileno=self._fd)  # the same descriptor, not a copy: ``detach`` before closing
        self._sock.setblocking(False)
        self._buffer = bytearray(_RECEIVE_SIZE)  # reused by every read: one allocation per connection
        self._pending: bytes | bytearray = pending
        self._parked = True  # whether the last receive waited (gave other tasks their turn)

    @classmethod
    def of(cls, stream: trio.abc.Stream) -> PlainSocket | None:
        """The plain socket under ``stream``: a ``SocketStream``, or one under the octets read to tell the protocol
        (``PrefixedStream``, whose octets it takes over: the first ``receive`` returns them); None under TLS, or
        off a socket (memory streams)."""
        inner = stream.transport_stream if isinstance(stream, PrefixedStream) else stream
        if not isinstance(inner, trio.SocketStream) or inner.socket.fileno() < 0:
            return None  # (a closed socket is left to the stream, which reports it as the end)
        pending = stream.take_prefix() if isinstance(stream, PrefixedStream) else b""
        return cls(inner.socket, pending)

    async def receive(self, deadline: float | None) -> bytes | bytearray | None:
        """The next octets from the peer (``b""``: it ended or the socket broke); None when ``deadline`` (trio time)
        passes first."""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        waited = False
        while True:
            if deadline is not None and trio.current_time() >= deadline:
                return None
            try:
                size = self._sock.recv_into(self._buffer)
            except BlockingIOError:
                pass
            except OSError:
                return b""
            else:
                data = self._buffer[:size]  # a copy the size of the read: the engines take bytes or bytearray
                if not waited and not self._parked:  # the last read did not wait either: the others' turn first
                    self._pending = data  # (returned by the next call if we are cancelled: nothing read is lost)
                    await trio.lowlevel.checkpoint()
                    self._pending = b""
                self._parked = waited
                return data
            waited = True
            try:
                if deadline is None:
                    await trio.lowlevel.wait_readable(self._fd)
                else:
                    with trio.move_on_at(deadline):
                        await trio.lowlevel.wait_readable(self._fd)
            except trio.ClosedResourceError:
                return b""

    def send(self, data: bytes | memoryview) -> int:
        """Write what the socket takes of ``data`` now, without waiting; the octets taken (0 when it is full).
        Raises ``OSError`` when the peer is gone."""
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0

    def detach(self) -> None:
        """Let go of the descriptor (the stream closes it)."""
        self._sock.detach()
