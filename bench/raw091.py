"""The raw-socket AMQP 0-9-1 client of ``bench.amqp091``: a plain socket around ``minibroker.amqp091``'s frame
encoders and ``FrameReader``, so the client costs a few µs per message and the broker sets the pace.

It speaks just enough of the protocol for a benchmark: the handshake (§2.2.4: start/start-ok with PLAIN,
tune/tune-ok, open/open-ok), channel open, synchronous ``call``s, and pipelined writes of pre-encoded
frames (``queue`` then ``flush``). Every frame read goes to ``on_frame`` (content header and body frames
too); a ``connection.close`` or ``channel.close`` from the broker raises ``BrokerClosed`` with its reply.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from typing import TypeVar

from bench.raw import IO_TIMEOUT, RECV_SIZE, BrokerClosed
from minibroker.amqp091.base import Method
from minibroker.amqp091.definitions import (
    ChannelClose,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
)
from minibroker.amqp091.frames import PROTOCOL_HEADER, Frame, FrameReader, MethodFrame, encode_method_frame

FRAME_MAX = 131072
M = TypeVar("M", bound=Method)


class ConfirmTally:
    """How many publishes the broker confirmed (basic.ack or basic.nack), from delivery tags 1, 2, ...; a
    confirm with ``multiple`` covers every tag up to its own (RabbitMQ's confirms extension)."""

    __slots__ = ("above", "floor")

    def __init__(self) -> None:
        self.floor = 0
        """Every tag up to this one is confirmed."""
        self.above: set[int] = set()
        """Tags above ``floor`` confirmed one by one."""

    @property
    def count(self) -> int:
        return self.floor + len(self.above)

    def add(self, tag: int, *, multiple: bool) -> None:
        above = self.above
        if multiple and tag > self.floor:
            self.floor = tag
            above.difference_update([t for t in above if t <= tag])
        elif tag > self.floor:
            above.add(tag)
        while self.floor + 1 in above:
            self.floor += 1
            above.discard(self.floor)


class Raw091Client:
    """One AMQP 0-9-1 connection over a plain socket, logged in and open (heartbeats off)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        timeout: float = IO_TIMEOUT,
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.reader = FrameReader()
        self.out = bytearray()
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(ConnectionStart)
        self.send(0, ConnectionStartOk({"product": "bench.raw091"}, "PLAIN", f"\0{user}\0{password}".encode(), "en_US"))
        tune = self.expect(ConnectionTune)
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        self.send(0, ConnectionTuneOk(tune.channel_max, self.frame_max, 0))
        self.reader.frame_max = self.frame_max
        self.call(0, ConnectionOpen(vhost), ConnectionOpenOk)

    # -- hooks --------------------------------------------------------------------------------------
    def on_frame(self, frame: Frame) -> None:
        """Called with every frame read outside ``expect``."""

    # -- writing ------------------------------------------------------------------------------------
    def send(self, channel: int, method: Method) -> None:
        """Queue one method frame (written by the next ``flush``)."""
        self.out += encode_method_frame(channel, method)

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(self.out)
            self.out.clear()

    # -- reading ------------------------------------------------------------------------------------
    def receive(self, timeout: float) -> list[Frame]:
        """The frames one read of the socket completes (none if nothing arrives within ``timeout``)."""
        if not select.select([self.sock], [], [], timeout)[0]:
            return []
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise BrokerClosed("the broker closed the connection")
        frames = self.reader.feed(data)
        for frame in frames:
            if isinstance(frame, MethodFrame) and isinstance(frame.method, ConnectionClose | ChannelClose):
                raise BrokerClosed(f"{frame.method.NAME} {frame.method.reply_code} {frame.method.reply_text}")
        return frames

    def pump(self, timeout: float) -> None:
        """Flush, then hand the frames of one read (waiting up to ``timeout``) to ``on_frame``."""
        self.flush()
        for frame in self.receive(timeout):
            self.on_frame(frame)

    def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """Pump until ``condition()``; ``TimeoutError`` after ``timeout`` (default: the client's)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the broker did not answer in time")
            self.pump(0.2)

    def expect(self, kind: type[M]) -> M:
        """Flush, then read until a method of ``kind`` arrives (the frames before it go to ``on_frame``)."""
        self.flush()
        deadline = time.monotonic() + self.timeout
        pending: list[Frame] = []
        while True:
            if not pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {kind.NAME} from the broker within {self.timeout} s")
                pending = self.receive(0.2)
                continue
            frame = pending.pop(0)
            if isinstance(frame, MethodFrame) and isinstance(frame.method, kind):
                for rest in pending:  # what came in the same read after the answer
                    self.on_frame(rest)
                return frame.method
            self.on_frame(frame)

    def call(self, channel: int, method: Method, reply: type[M]) -> M:
        """Send a synchronous method and return its answer."""
        self.send(channel, method)
        return self.expect(reply)

    def open_channel(self, channel: int) -> None:
        self.call(channel, ChannelOpen(), ChannelOpenOk)

    def close(self) -> None:
        """connection.close, its close-ok awaited, then the socket closed."""
        try:
            self.call(0, ConnectionClose(200, "bye"), ConnectionCloseOk)
        except (OSError, BrokerClosed, TimeoutError):
            pass
        finally:
            self.sock.close()


__all__ = ["FRAME_MAX", "ConfirmTally", "Raw091Client"]
